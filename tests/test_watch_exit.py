"""What ``abwatch watch --once`` says when a job of its pass fails: a real watch of a real git
repository on a board whose tracker is down (nothing listens on its port), so the comparison
cannot start; a commit that does not build is an outcome, not a failure.
"""

from __future__ import annotations

import pytest
import socket
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.watch.daemon import pass_exit_code
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Job, WatchedCommit

from tests.test_watch import shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

TVM_WORKLOAD = '[[workloads]]\nname = "mlp"\nkind = "tvm"\nmodel = "builtin:mlp"\n'


def dead_port() -> int:
    """A port nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_job_makes_the_pass_incomplete_and_is_named(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = Path(write_watch_config(tmp_path, repo, ""))
    text = config.read_text()
    # the C workload becomes a TVM one (an rpc runner runs nothing else); it never gets to run
    text = text.replace('[[workloads]]\nname = "loop"\ncommand = ["./bench", "10"]\n', TVM_WORKLOAD)
    text = text.replace('[runner]\ndevice = "bench-box"',
                        f'[runner]\nkind = "rpc"\ntracker = "127.0.0.1:{dead_port()}"\nkey = "board-1"')
    config.write_text(text)
    assert main(["watch", "--config", str(config), "--once", "--db", sqlite_url]) == 0  # the baseline builds
    make_demo_repo(repo, (step("next", "README", note="n"),))
    capsys.readouterr()
    assert main(["watch", "--config", str(config), "--once", "--db", sqlite_url]) == 4
    err = capsys.readouterr().err
    tags = shas(repo)
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        jobs = {j.payload["sha"]: j for j in session.scalars(select(Job))}
        statuses = {w.commit.sha: w.status for w in session.scalars(select(WatchedCommit))}
    failed = jobs[tags["next"]]
    assert failed.status == "failed" and "is not reachable" in failed.error
    # named by job, device, commit and cause, once as it happens and once in the summary
    line = f"job {failed.id} on board-1 (commit {tags['next'][:12]}) FAILED: RunnerUnavailable: rpc runner: tracker"
    assert err.count(line) == 2, err
    assert "1 job(s) of this pass failed; exit 4" in err
    assert statuses[tags["next"]] == "failed"
    # nothing new: the next pass has nothing to fail
    assert main(["watch", "--config", str(config), "--once", "--db", sqlite_url]) == 0
    engine.dispose()


def test_a_commit_that_does_not_build_is_an_outcome_not_a_failure(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, "")
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, (step("broken", "Break the build", broken=True),))
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    assert "FAILED" not in capsys.readouterr().err.replace("build FAILED", "")
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        assert {j.status for j in session.scalars(select(Job))} == {"done"}
        assert {w.status for w in session.scalars(select(WatchedCommit))} == {"baseline", "build_failed"}
    engine.dispose()


def test_a_confirmed_regression_wins_over_a_failed_job():
    assert pass_exit_code([], []) == 0
    assert pass_exit_code([], ["job 3 FAILED"]) == 4
    assert pass_exit_code([7], ["job 3 FAILED"]) == 1
    assert pass_exit_code([7], []) == 1
