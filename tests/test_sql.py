"""The SQL surface: views on both databases, docs/sql.md's queries, the read-only role."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from abwatch.service.store import db, locks
from abwatch.service.cli.main import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "sql.md"
VIEWS = ("regression_history", "workload_series", "latest_status")


def sql_blocks() -> list[str]:
    """Every ```sql block of docs/sql.md."""
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_views_exist_on_both_databases(db_url):
    engine = db.make_engine(db_url)
    db.upgrade(db_url)
    with engine.connect() as connection:
        for view in VIEWS:
            result = connection.execute(text(f"SELECT * FROM {view}"))
            assert result.fetchall() == []
            assert "workload" in result.keys()  # noqa: SIM118 - a Result, not a dict
    engine.dispose()


def test_views_answer_from_real_runs(filled_pg_url):
    url, runs = filled_pg_url
    engine = db.make_engine(url)
    with engine.connect() as connection:
        history = connection.execute(text("SELECT * FROM regression_history")).mappings().all()
        assert len(history) == 1
        (row,) = history
        assert (row["workload"], row["kind"], row["state"]) == ("lcg-loop", "runtime", "regress")
        # a compare and its verify: the range is known, no bisection named a culprit
        assert row["culprit_sha"] is None and row["bisection_steps"] == 0 and row["run_id"] == runs["regression"]
        summary = connection.execute(text("SELECT summary FROM commits WHERE sha = :s"), {"s": row["bad_sha"]}).scalar()
        assert summary == "Do 20% more work"
        assert row["verified_at"] is not None and row["verified_at"] >= row["opened_at"]
        assert row["closed_at"] is None
        series = connection.execute(text(
            "SELECT summary, median_ms, side, verdict FROM workload_series ORDER BY committed_at")).all()
        assert [s.summary for s in series] == [
            "Baseline", "Reword the README only", "Do 20% more work", "Do 20% less work"]
        # medians of different runs are not compared with each other: runs taken minutes apart
        # on a busy machine differ by more than the 20 % steps (the verdicts compare within a run)
        assert all(s.median_ms > 0 for s in series)
        assert series[0].side == "control" and series[-1].verdict == "improvement"
        latest = connection.execute(text("SELECT * FROM latest_status")).mappings().all()
        assert len(latest) == 1
        assert latest[0]["run_id"] == runs["faster"] and latest[0]["verdict"] == "improvement"
        assert latest[0]["open_regressions"] == 1
    engine.dispose()


def test_every_query_in_the_sql_doc_runs(filled_pg_url):
    url, _ = filled_pg_url
    blocks = sql_blocks()
    assert len(blocks) >= 10
    engine = db.make_engine(url)
    with engine.connect() as connection:
        for number, sql in enumerate(blocks, start=1):
            result = connection.execute(text(sql.replace(":", r"\:")))
            rows = result.fetchall()
            if "-- rows:" not in sql:  # a block that may be empty says when it has rows
                assert rows, f"docs/sql.md query {number} returned no rows:\n{sql}"
    engine.dispose()


def test_grant_readonly_role_reads_and_cannot_write(fresh_pg_url, pg_admin, capsys):
    role = f"abwatch_ro_{uuid.uuid4().hex[:8]}"
    try:
        assert main(["db", "grant-readonly", role, "--db", fresh_pg_url]) == 0
        assert f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"' in capsys.readouterr().out
        as_role = make_url(fresh_pg_url).set(username=role)
        connection = psycopg2.connect(host=as_role.host, port=as_role.port, user=role, dbname=as_role.database)
        connection.autocommit = True
        cursor = connection.cursor()
        for view in VIEWS + ("runs", "samples"):
            cursor.execute(f"SELECT count(*) FROM {view}")
            assert cursor.fetchone() == (0,)
        # Read-only by default, and also without that default: privileges refuse the writes.
        cursor.execute("SHOW default_transaction_read_only")
        assert cursor.fetchone() == ("on",)
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE")
        for statement in (
            "INSERT INTO repositories (url, created_at) VALUES ('/x', now())",
            "UPDATE runs SET status = 'failed'",
            "DELETE FROM samples",
            "CREATE TABLE mine (id int)",
            "CREATE VIEW mine AS SELECT 1",
        ):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cursor.execute(statement)
        # nor can it take a device's lock (it once held a compare up) or make temporary tables
        key = locks.lock_key("bench-box")
        for statement in (f"SELECT pg_try_advisory_lock({locks.DEVICE_LOCK}, {key})",
                          f"SELECT pg_advisory_xact_lock({locks.DEVICE_LOCK}, {key})",
                          "SELECT pg_try_advisory_lock(42)",
                          "CREATE TEMPORARY TABLE mine (id int)"):
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cursor.execute(statement)
        connection.close()
        # the writer still can
        engine = db.make_engine(fresh_pg_url)
        with locks.device_lock(engine, "bench-box", "test", Path("/nonexistent")), engine.connect() as writer:
            writer.execute(text("CREATE TEMPORARY TABLE mine (id int)"))
        engine.dispose()
    finally:
        _drop_role(pg_admin, fresh_pg_url, role)


def test_grant_readonly_rejects_a_bad_role_name(fresh_pg_url, capsys):
    assert main(["db", "grant-readonly", "x; DROP TABLE runs", "--db", fresh_pg_url]) == 2
    assert "role 'x; DROP TABLE runs'" in capsys.readouterr().err


def _drop_role(pg_admin, url: str, role: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        if connection.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
            connection.execute(text(f'DROP OWNED BY "{role}"'))
    engine.dispose()
    with pg_admin.connect() as connection:
        connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
