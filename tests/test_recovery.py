"""A service that runs for months: kills, signals, dead databases and odd URLs end cleanly.

Every test here runs the real ``abwatch`` command as a separate process and kills it for
real (SIGKILL, SIGTERM), then looks at what the next command finds in the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import git
import pytest
from sqlalchemy import func, inspect, select

from abwatch.service.compare.liveness import Periodic
from abwatch.service.store import db
from abwatch.service.store.models import Invocation, Regression, RegressionEvent, Run, RunStatus, RunType
from abwatch.service.stats.verdict import RegressionState
from tests.test_compare import compare, run_cli

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

ABWATCH = [sys.executable, "-m", "abwatch.service.cli.main"]


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*ABWATCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def _wait_for(predicate, timeout_s: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _invocations(url: str, run_type: RunType | None = None) -> int:
    engine = db.make_engine(url)
    try:
        if not inspect(engine).has_table("invocations"):
            return 0
        with db.session_scope(engine) as session:
            query = select(func.count()).select_from(Invocation).join(Run, Run.id == Invocation.run_id)
            if run_type is not None:
                query = query.where(Run.run_type == run_type)
            return session.scalar(query)
    finally:
        engine.dispose()


def _runs(url: str) -> list[Run]:
    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        return list(session.scalars(select(Run).order_by(Run.id)))


def test_kill_9_mid_run_is_marked_abandoned_by_the_next_command(write_config, db_url, capsys):
    config = write_config(repetitions=40, run_extra="max_repetitions = 40")
    proc = _start(["compare", "--config", str(config), "--control", "base", "--treatment", "noop", "--db", db_url])
    _wait_for(lambda: _invocations(db_url) >= 6, what="six stored invocations")
    proc.kill()
    proc.communicate()  # reaps it and closes its pipes
    [run] = _runs(db_url)
    assert run.status == RunStatus.RUNNING and run.pid == proc.pid  # nobody has looked yet
    kept = _invocations(db_url)
    assert kept >= 6  # each invocation was committed as it finished

    code, _, err = run_cli(capsys, "runs", "--db", db_url)
    assert code == 0
    assert f"run {run.id} marked abandoned" in err
    [run] = _runs(db_url)
    assert run.status == RunStatus.ABANDONED and "died" in run.error
    assert _invocations(db_url) == kept  # nothing measured was lost


def test_sigterm_ends_the_run_as_interrupted_without_a_traceback(write_config, sqlite_url):
    config = write_config(repetitions=40, run_extra="max_repetitions = 40")
    proc = _start(["compare", "--config", str(config), "--control", "base", "--treatment", "noop", "--db", sqlite_url])
    _wait_for(lambda: _invocations(sqlite_url) >= 4, what="four stored invocations")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err
    [run] = _runs(sqlite_url)
    assert run.status == RunStatus.INTERRUPTED and run.finished_at is not None
    assert _invocations(sqlite_url) >= 4


def test_a_killed_verify_returns_its_regression_to_benchmark(write_config, db_url, capsys, monkeypatch):
    monkeypatch.setenv("FLAKY_SLOWDOWN", "1.3")
    config = write_config(repetitions=10)
    code, first, _ = compare(capsys, config, db_url, "base", "flaky")
    assert code == 1
    proc = _start(["verify", str(first["run_id"]), "--db", db_url], env={"FLAKY_SLOWDOWN": "1.3"})
    _wait_for(lambda: _invocations(db_url, RunType.VERIFY) >= 2, what="the verify run's invocations")
    proc.kill()
    proc.communicate()  # reaps it and closes its pipes
    engine = db.make_engine(db_url)
    with db.session_scope(engine) as session:
        assert session.scalars(select(Regression)).one().state == RegressionState.VERIFY

    code, payload, err = run_cli(capsys, "regressions", "--json", "--db", db_url)
    assert code == 0 and "returned to benchmark" in err
    with db.session_scope(engine) as session:
        regression = session.scalars(select(Regression)).one()
        assert regression.state == RegressionState.BENCHMARK
        last = session.scalars(select(RegressionEvent).order_by(RegressionEvent.id.desc())).first()
        assert "abandoned" in last.reason and "can be verified again" in last.reason
    # and it can be verified again, to the end
    code, verified, _ = run_cli(capsys, "verify", str(first["run_id"]), "--json", "--db", db_url)
    assert code == 1 and verified["regressions"][0]["state"] == "regress"


def test_a_build_killed_mid_way_leaves_no_checkout_or_worktree(tmp_path, sqlite_url, capsys):
    repo_dir = tmp_path / "slowbuild"
    repo = git.Repo.init(repo_dir)
    (repo_dir / "build.sh").write_text("mkdir -p out; echo '{\"runtime_ms\": 1}' > out/r.json; sleep \"${SLOW:-0}\"\n")
    repo.index.add(["build.sh"])
    repo.index.commit("slow build")
    repo.create_tag("v1")
    config = tmp_path / "slow.toml"
    config.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(repo_dir))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
env = {{SLOW = "60"}}
[[workloads]]
name = "cat"
command = ["cat", "r.json"]
[run]
repetitions = 3
max_repetitions = 3  # the checkout is the point, not a verdict: no extra looks on a busy host
""")
    proc = _start(["compare", "--config", str(config), "--control", "v1", "--treatment", "v1", "--db", sqlite_url])
    checkouts = tmp_path / "cache" / "checkouts"
    _wait_for(lambda: checkouts.is_dir() and any(checkouts.iterdir()), what="the build's checkout")
    time.sleep(0.5)
    proc.kill()
    proc.communicate()  # reaps it and closes its pipes
    mirror = next((tmp_path / "cache" / "repos").glob("*.git"))
    assert "detached" in git.Repo(mirror).git.worktree("list")  # left registered by the kill

    config.write_text(config.read_text().replace('env = {SLOW = "60"}', ""))
    code, _, err = compare(capsys, config, sqlite_url, "v1", "v1")
    assert code == 0, err
    assert list(checkouts.iterdir()) == []  # the killed build's checkout is gone
    assert git.Repo(mirror).git.worktree("list").count("\n") == 0  # only the mirror itself


def test_postgres_urls_in_the_usual_form_work(empty_pg_url, capsys):
    plain = empty_pg_url.replace("postgresql+psycopg2://", "postgresql://")
    assert run_cli(capsys, "db", "upgrade", "--db", plain)[0] == 0
    for url in (plain, plain.replace("postgresql://", "postgres://")):
        code, _, err = run_cli(capsys, "runs", "--json", "--db", url)
        assert code == 0, err


def test_an_unknown_driver_is_a_one_line_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "runs", "--db", "mysql+nosuchdriver://u@h/d")
    assert code == 2 and "unknown database driver" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_unreachable_database_names_it_with_the_password_masked(capsys):
    url = "postgresql://abwatch:hunter2@127.0.0.1:1/abwatch"
    code, _, err = run_cli(capsys, "runs", "--db", url)
    assert code == 5 and code not in (0, 1)
    assert "hunter2" not in err and "abwatch:***@127.0.0.1:1/abwatch" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_read_only_commands_never_create_a_schema(capsys, empty_pg_url):
    for args in (["regressions"], ["db", "current"], ["runs"], ["records", "export"]):
        code, _, err = run_cli(capsys, *args, "--db", empty_pg_url)
        assert code in (0, 2), err
        assert inspect(db.make_engine(empty_pg_url)).get_table_names() == [], args


def test_credentials_in_the_repository_url_are_never_printed(tmp_path, sqlite_url, capsys):
    config = tmp_path / "secret.toml"
    config.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = "https://builder:ghp_s3cr3t@127.0.0.1:1/tvm.git"
[build]
command = ["true"]
[[workloads]]
name = "w"
command = ["true"]
""")
    code, _, err = compare(capsys, config, sqlite_url, "main", "main")
    assert code == 2
    assert "ghp_s3cr3t" not in err and "builder:***@127.0.0.1" in err


@pytest.mark.parametrize("bad", ["x" * 300])
def test_an_overlong_ref_is_a_usage_error(bad, write_config, sqlite_url, capsys):
    code, _, err = compare(capsys, write_config(), sqlite_url, "base", bad)
    assert code == 2 and "characters long" in err


def test_a_periodic_beat_that_breaks_is_said_once_and_goes_on():
    """A beat that fails for a reason other than a lost connection is said (once per kind) rather
    than swallowed; the thread keeps beating."""
    class Broken(Periodic):
        def __init__(self) -> None:
            super().__init__(0.01, "broken-beat")
            self.ticks, self.said, self.enough = 0, [], threading.Event()

        def tick(self) -> None:
            self.ticks += 1
            if self.ticks >= 20:
                self.enough.set()
            raise ValueError("no such column") if self.ticks % 2 else KeyError("device")

        def failed(self, exc: Exception) -> None:
            self.said.append(type(exc).__name__)

    with Broken() as beat:
        assert beat.enough.wait(30)
    assert beat.ticks >= 20 and sorted(beat.said) == ["KeyError", "ValueError"]
