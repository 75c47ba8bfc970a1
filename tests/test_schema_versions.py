"""Schema mismatches: a database newer than this abwatch is refused with the version to install
(never "run abwatch db upgrade", which cannot help), and a downgrade that drops or changes data
lists it and needs ``--yes``. Real PostgreSQL (and SQLite where it costs nothing)."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from abwatch.service.cli.main import main
from abwatch.service.compare import lifecycle
from abwatch.service.stats import Outcome
from abwatch.service.stats.verdict import RegressionState as S
from abwatch.service.store import db
from abwatch.service.store.models import (
    Comparison, Commit, Regression, Repository, Run, RunStatus, RunType, SchemaVersion, Workload,
)


def test_each_upgrade_notes_the_abwatch_that_made_the_revision(empty_db_url):
    db_url = empty_db_url
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        rows = {r.revision: r.abwatch_version for r in session.scalars(select(SchemaVersion))}
    assert rows == {db.head_revision(db_url): db.abwatch_version()}
    engine.dispose()


def test_a_database_newer_than_this_abwatch_names_the_version_to_install(fresh_pg_url, capsys):
    url = fresh_pg_url
    db.upgrade(url)
    engine = db.make_engine(url)
    with engine.begin() as connection:  # what a later abwatch leaves: a revision this one has never seen
        connection.execute(text("UPDATE alembic_version SET version_num = '0099'"))
        connection.execute(text("INSERT INTO schema_versions VALUES ('0099', '9.9.0', now())"))
    for argv in (["db", "upgrade"], ["runs"], ["regressions"], ["triage", "1", "--as", "expected"],
                 ["db", "downgrade", "--revision", "0019"]):
        capsys.readouterr()
        assert main([*argv, "--db", url]) == 2, argv
        err = capsys.readouterr().err
        assert "schema revision 0099 is newer than this abwatch" in err, argv
        assert "abwatch 9.9.0 migrated it; install abwatch 9.9.0 or newer" in err, argv
        assert "run `abwatch db upgrade`" not in err
    with engine.connect() as connection:  # nothing was touched
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0099"
        connection.execute(text("DELETE FROM schema_versions")).close()
        connection.commit()
    capsys.readouterr()
    assert main(["runs", "--db", url]) == 2  # no row about it: it still says what it knows
    assert "a newer abwatch migrated it; install the abwatch that migrated it" in capsys.readouterr().err
    engine.dispose()


def _history(session: Session) -> None:
    """A comparison with its fastest-sample figures and a regression that was fixed."""
    repo = Repository(url="/schema")
    session.add(repo)
    session.flush()
    a, b = Commit(repository_id=repo.id, sha="a" * 40), Commit(repository_id=repo.id, sha="b" * 40)
    workload = Workload(repository_id=repo.id, name="w", spec_hash="h", kind="command", spec={})
    session.add_all([a, b, workload])
    session.flush()
    run = Run(run_type=RunType.BENCHMARK, status=RunStatus.COMPLETED, repository_id=repo.id, control_ref="a",
              treatment_ref="b", control_commit_id=a.id, treatment_commit_id=b.id, seed=1)
    session.add(run)
    session.flush()
    comparison = Comparison(run_id=run.id, workload_id=workload.id, verdict=Outcome.REGRESSION, change_pct=7.5,
                            control_n=10, treatment_n=10, details={}, control_fastest_ms=4.0,
                            treatment_fastest_ms=4.3)
    session.add(comparison)
    session.flush()
    regression = lifecycle.open_regression(session, run, comparison)
    for state in (S.VERIFY, S.REGRESS, S.FIXED):
        lifecycle.transition(session, regression, state, run, "test")
    session.commit()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_downgrade_that_loses_data_lists_it_and_needs_yes(fresh_pg_url, capsys):
    url = fresh_pg_url
    db.upgrade(url)
    engine = db.make_engine(url)
    with Session(engine) as session:
        _history(session)
    capsys.readouterr()
    assert main(["db", "downgrade", "--revision", "0008", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "1 row(s): regressions.state: these fixed regressions become open (regress) again (migration 0009)" in err
    assert "1 row(s): comparisons.control_fastest_ms / treatment_fastest_ms" in err
    assert "add --yes" in err and "nothing was changed" in err
    assert db.current_revision(engine) == db.head_revision(url)
    with Session(engine) as session:
        assert session.scalars(select(Regression)).one().state == S.FIXED

    # a downgrade that loses nothing here (no regression of another metric, no offsets) goes on
    assert main(["db", "downgrade", "--revision", "0018", "--db", url]) == 0
    assert db.current_revision(engine) == "0018"
    assert main(["db", "upgrade", "--db", url]) == 0

    assert main(["db", "downgrade", "--revision", "0017", "--db", url, "--yes"]) == 0
    assert "dropped or changed:" in capsys.readouterr().err
    assert main(["db", "upgrade", "--db", url]) == 0
    with engine.connect() as connection:  # what the listing said would go, went
        assert connection.execute(text("SELECT control_fastest_ms FROM comparisons")).scalar() is None
    assert main(["db", "downgrade", "--revision", "nope", "--db", url]) == 2
    assert "--revision 'nope': no such schema revision" in capsys.readouterr().err
    engine.dispose()


def test_a_reading_command_creates_no_sqlite_file_and_a_missing_directory_is_named(tmp_path, capsys):
    missing = tmp_path / "none.db"
    assert main(["runs", "--db", f"sqlite:///{missing}"]) == 2
    assert f"no database at {missing}" in capsys.readouterr().err and not missing.exists()
    nowhere = tmp_path / "no-such-dir" / "abwatch.db"
    for argv in (["runs"], ["db", "upgrade"]):  # a reader and a writer alike
        assert main([*argv, "--db", f"sqlite:///{nowhere}"]) == 2
        assert f"the directory {nowhere.parent} does not exist" in capsys.readouterr().err
    assert not nowhere.parent.exists()
