"""Schema through Alembic only: upgrade/downgrade on both databases, models match migrations."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError, StatementError

from abwatch.service.store import db
from abwatch.service.store.models import Base, Device, Workload

TABLES = {
    "repositories", "commits", "builds", "devices", "workloads", "runs", "invocations",
    "samples", "comparisons", "regressions", "regression_events", "records",
}


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_upgrade_to_head_and_downgrade_to_empty(empty_db_url):
    db_url = empty_db_url
    engine = db.make_engine(db_url)
    assert db.current_revision(engine) is None
    db.upgrade(db_url)
    assert db.current_revision(engine) == db.head_revision(db_url)
    assert set(inspect(engine).get_table_names()) >= TABLES
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"
    db.downgrade(db_url)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    engine.dispose()


def test_ensure_schema_migrates_empty_and_refuses_foreign(empty_db_url):
    db_url = empty_db_url
    engine = db.make_engine(db_url)
    assert db.current_revision(engine) is None
    db.ensure_schema(engine)
    assert db.current_revision(engine) == db.head_revision(db_url)
    db.ensure_schema(engine)  # idempotent at head
    engine.dispose()


def test_ensure_schema_refuses_an_unrelated_database(empty_sqlite_url):
    engine = db.make_engine(empty_sqlite_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE something_else (id INTEGER)"))
    with pytest.raises(db.SchemaError, match="no abwatch schema version"):
        db.ensure_schema(engine)


def test_ensure_schema_refuses_an_old_revision(sqlite_url):
    engine = db.make_engine(sqlite_url)
    db.upgrade(sqlite_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0018'"))  # an older revision it knows
    with pytest.raises(db.SchemaError, match="run `abwatch db upgrade`"):
        db.ensure_schema(engine)


def test_enums_are_stored_by_value_and_checked(session):
    from abwatch.service.store.models import Build, BuildStatus, Commit, Repository

    repo = Repository(url="/r")
    session.add(repo)
    session.flush()
    session.add(Workload(repository_id=repo.id, name="w", spec_hash="h", kind="command", spec={}))
    session.flush()
    commit = Commit(repository_id=repo.id, sha="a" * 40)
    session.add(commit)
    session.flush()
    session.add(Build(commit_id=commit.id, builder="command", config_hash="h", status=BuildStatus.BUILD_FAILED))
    session.flush()
    stored = session.execute(text("SELECT status FROM builds")).scalar_one()
    assert stored == "build_failed"
    with pytest.raises((IntegrityError, StatementError)), session.begin_nested():
        session.execute(text("UPDATE builds SET status = 'bogus'"))


def test_regression_kinds_are_one_vocabulary_the_schema_checks(db_url):
    """A regression's kind is RegressionKind's value, and the database refuses any other word."""
    from abwatch.service.stats.verdict import RegressionKind

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    with engine.connect() as connection:
        check = " ".join(str(c["sqltext"]) for c in inspect(connection).get_check_constraints("regressions"))
    assert all(f"'{kind.value}'" in check for kind in RegressionKind)
    with engine.begin() as connection:  # rows elsewhere are not needed: constraints are not enforced for them
        connection.execute(text("PRAGMA foreign_keys=OFF" if engine.dialect.name == "sqlite"
                                else "SET session_replication_role = replica"))
        columns = ("workload_id, control_commit_id, treatment_commit_id, run_id, comparison_id, state, change_pct, "
                   "created_at, updated_at")
        values = "1, 1, 2, 1, 1, 'benchmark', 5.0, '2026-01-01', '2026-01-01'"
        connection.execute(text(f"INSERT INTO regressions ({columns}, kind) VALUES ({values}, 'runtime')"))
        with pytest.raises(IntegrityError, match="regression_kind"), connection.begin_nested():
            connection.execute(text(f"INSERT INTO regressions ({columns}, kind) VALUES ({values}, 'speed')"))
        connection.rollback()
    engine.dispose()


def test_triage_statuses_are_the_ones_the_schema_checks_and_fixed_goes_back_to_acknowledged(empty_db_url):
    """Both triage columns take every TriageStatus (``fixed`` since 0026, with the fixing commit
    in ``triage_events.fixed_by``) and refuse any other word; a downgrade makes a fix an
    acknowledged regression again, as it was recorded before."""
    from abwatch.service.stats.verdict import TriageStatus

    db_url = empty_db_url
    db.upgrade(db_url, "0025")
    engine = db.make_engine(db_url)
    columns = ("workload_id, control_commit_id, treatment_commit_id, run_id, comparison_id, state, change_pct, "
               "created_at, updated_at, kind")
    values = "1, 1, 2, 1, 1, 'regress', 5.0, '2026-01-01', '2026-01-01', 'runtime'"
    event = "INSERT INTO triage_events (regression_id, status, who, note, at) VALUES (1, '{}', 'ana', '', '2026-01-02')"

    def insert(connection, triage: str) -> None:
        connection.execute(text(f"INSERT INTO regressions ({columns}, triage) VALUES ({values}, '{triage}')"))
        connection.execute(text(event.format(triage)))

    def rows_elsewhere_not_needed(connection) -> None:  # foreign keys are not checked for these rows
        connection.execute(text("PRAGMA foreign_keys=OFF" if engine.dialect.name == "sqlite"
                                else "SET session_replication_role = replica"))

    with engine.begin() as connection:  # before: `fixed` is no triage word
        rows_elsewhere_not_needed(connection)
        with pytest.raises(IntegrityError, match="triage_status"), connection.begin_nested():
            insert(connection, "fixed")
        insert(connection, "acknowledged")
    db.upgrade(db_url)
    with engine.connect() as connection:
        for table in ("regressions", "triage_events"):
            check = " ".join(str(c["sqltext"]) for c in inspect(connection).get_check_constraints(table))
            assert all(f"'{status.value}'" in check for status in TriageStatus), (table, check)
    with engine.begin() as connection:
        rows_elsewhere_not_needed(connection)
        connection.execute(text("UPDATE regressions SET triage = 'fixed'"))
        connection.execute(text("UPDATE triage_events SET status = 'fixed', fixed_by = 'abc1234'"))
        with pytest.raises(IntegrityError, match="triage_event_status"), connection.begin_nested():
            connection.execute(text(event.format("mended")))
        assert connection.execute(text("SELECT regression_id, status, fixed_by FROM triage_events")).one() == (
            1, "fixed", "abc1234")  # the row from before the upgrade kept
    assert [loss.what.split(":")[0] for loss in db.downgrade_losses(db_url, "0025")] == [
        "triage 'fixed' and triage_events.fixed_by"]
    db.downgrade(db_url, "0025")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT triage FROM regressions")).scalar_one() == "acknowledged"
        assert connection.execute(text("SELECT status FROM triage_events")).scalar_one() == "acknowledged"
        assert "fixed_by" not in {c["name"] for c in inspect(connection).get_columns("triage_events")}
        assert connection.execute(text("SELECT COUNT(*) FROM latest_status")).scalar_one() == 0  # the view is back
    engine.dispose()


def test_one_device_row_per_name_and_fingerprint(session):
    session.add(Device(name="board-1", kind="rpc", hardware_config={}, fingerprint_hash="aa"))
    session.flush()
    session.add(Device(name="board-1", kind="rpc", hardware_config={}, fingerprint_hash="bb"))  # another series
    session.flush()
    with pytest.raises(IntegrityError), session.begin_nested():
        session.add(Device(name="board-1", kind="rpc", hardware_config={}, fingerprint_hash="aa"))
        session.flush()
