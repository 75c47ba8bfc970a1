"""A database that drops every connection (what a server restart does to its clients): an idle
``abwatch worker`` reconnects with backoff, says so, and takes the next job; a command whose
connection dies names the real cause. The shared server is not restarted: the connections of
the test's own database are terminated (``pg_terminate_backend``), as a restart would."""

from __future__ import annotations

import pytest
import subprocess
import sys
import time

from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Job, JobStatus
from tests.test_watch import step, write_watch_config


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def _terminate(pg_admin, url: str) -> int:
    """Drop every connection to ``url``'s database; how many there were."""
    with pg_admin.connect() as connection:
        return connection.execute(text(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": make_url(url).database}).scalar()


def _jobs(url: str) -> list[Job]:
    engine = db.make_engine(url)
    with Session(engine) as session:
        jobs = list(session.scalars(select(Job).order_by(Job.id)))
    engine.dispose()
    return jobs


def test_an_idle_worker_reconnects_after_its_connections_are_dropped(tmp_path, fresh_pg_url, pg_admin):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'control = "previous"')
    db.upgrade(fresh_pg_url)
    with open(tmp_path / "worker.log", "w+") as log:  # the worker writes it while it runs
        worker = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", config,
                                   "--device", "bench-box", "--db", fresh_pg_url], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "advisory" not in _activity(pg_admin, fresh_pg_url) and time.monotonic() < deadline:
                time.sleep(0.2)  # the worker has polled once: its lock connection is open
            assert _terminate(pg_admin, fresh_pg_url) >= 1
            # a job queued after the drop: the worker must come back for it
            assert main(["watch", "--config", config, "--once", "--no-work", "--db", fresh_pg_url]) == 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not all(j.status == JobStatus.DONE for j in _jobs(fresh_pg_url)):
                assert worker.poll() is None, f"the worker exited {worker.returncode}: {_read(log)}"
                time.sleep(0.5)
            assert [j.status for j in _jobs(fresh_pg_url)] == [JobStatus.DONE]
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        said = _read(log)
        assert "database connection lost (OperationalError: " in said, said
        assert "reconnected" in said and "PendingRollbackError" not in said


def test_a_command_whose_connection_dies_names_the_real_cause(write_config, fresh_pg_url, pg_admin, capsys,
                                                              monkeypatch):
    """The connection dies between two of the command's queries; the message names the
    OperationalError, not the PendingRollbackError a later use of the session raises."""
    from abwatch.service.read import stored

    real = stored.list_runs

    def list_runs_after_a_restart(session, *args, **kwargs):
        session.execute(text("SELECT 1"))  # the session holds its connection
        _terminate(pg_admin, fresh_pg_url)
        return real(session, *args, **kwargs)

    db.upgrade(fresh_pg_url)
    monkeypatch.setattr(stored, "list_runs", list_runs_after_a_restart)
    capsys.readouterr()
    assert main(["runs", "--db", fresh_pg_url]) == 5
    err = capsys.readouterr().err
    assert "database error at" in err and "OperationalError" in err and "PendingRollback" not in err


def _activity(pg_admin, url: str) -> str:
    with pg_admin.connect() as connection:
        return " ".join(q or "" for q in connection.execute(text(
            "SELECT query FROM pg_stat_activity WHERE datname = :d"), {"d": make_url(url).database}).scalars())


def _read(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()
