"""The long-running ``abwatch watch`` (not ``--once``) as a real process while its branch grows,
on SQLite (the jobs run in-process, one at a time) and on PostgreSQL (the same code, through
the queue). Large effects (+25 %, then back) judged by the instructions the processes retire keep
the verdicts firm however busy the machine (timed, a CI host under heavy load once left the fix
check undecided on both databases).
"""

from __future__ import annotations

import pytest
import json
import signal
import subprocess
import sys
import time

import git
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Commit, Job, Regression, Run, RunStatus, WatchedCommit

from tests.test_watch import COUNTED, step, write_watch_config


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def write_config(tmp_path, repo) -> str:
    """The watch config of these tests: a pass a second, changes under 2 % are noise, judged by
    retired instructions."""
    return write_watch_config(tmp_path, repo, "interval_s = 1", threshold_pct=2.0, measure=COUNTED)


def watched(engine) -> dict[str, str]:
    with Session(engine) as session:
        return {w.commit.sha: w.status for w in session.scalars(select(WatchedCommit))}


def test_a_long_running_watch_follows_a_growing_branch(tmp_path, db_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_config(tmp_path, repo)
    log = tmp_path / "watch.log"
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "watch", "--config", config,
                                 "--db", db_url], stdout=out, stderr=subprocess.STDOUT)
    engine = None

    def wait_for(what, predicate, deadline_s=400):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise AssertionError(f"watch exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}")
            try:
                if predicate():
                    return
            except Exception:  # the watch may still be creating the schema
                pass
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")

    try:
        engine = db.make_engine(db_url)
        tags = lambda: {t.name: t.commit.hexsha for t in git.Repo(repo).tags}  # noqa: E731
        wait_for("the baseline", lambda: watched(engine).get(tags()["base"]) == "baseline")
        make_demo_repo(repo, (step("noop", "Reword the README", note="words"),
                              step("slow25", "Do 25% more work", 1.25)))

        def running() -> bool:
            with Session(engine) as session:
                return session.scalar(select(Run.id).where(Run.status == RunStatus.RUNNING)) is not None
        wait_for("a comparison to be running", running)
        # commits pushed while the watch is in the middle of a pass
        make_demo_repo(repo, (step("noop2", "README again", 1.25, note="more"),
                              step("broken", "Break the build", 1.25, broken=True),
                              step("back", "Back to the original work", 1.0)))
        done = {"noop", "slow25", "noop2", "broken", "back"}
        def all_tested() -> bool:
            with Session(engine) as session:
                idle = all(j.status == "done" for j in session.scalars(select(Job)))
            return idle and all(watched(engine).get(tags()[t], "queued") != "queued" for t in done)
        wait_for("every new commit to be tested", all_tested)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0, log.read_text()  # stopped while idle: a clean exit
    t = tags()
    statuses = watched(engine)
    assert statuses == {t["base"]: "baseline", t["noop"]: "ok", t["slow25"]: "ok", t["noop2"]: "ok",
                        t["broken"]: "build_failed", t["back"]: "ok"}
    with Session(engine) as session:
        regressions = list(session.scalars(select(Regression)))
        culprits = {r.culprit_commit.sha for r in regressions if r.culprit_commit}
        assert culprits == {t["slow25"]}  # found, and nothing else named
        confirmed = [r for r in regressions if r.culprit_commit]
        # "back" returns to the original work: the regression is marked fixed
        assert [r.state.value for r in confirmed] == ["fixed"], [
            (e.from_state, e.to_state, e.reason) for r in confirmed for e in r.events]
        # the commit after the broken one was compared with the last good one
        back = session.scalar(select(WatchedCommit).join(WatchedCommit.commit).where(Commit.sha == t["back"]))
        assert back.control_sha == t["noop2"]
        jobs = list(session.scalars(select(Job)))
        assert len(jobs) == 6 and all(j.attempts == 1 for j in jobs)
    capsys.readouterr()
    assert main(["status", "--json", "--db", db_url]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["watched"][0]["last_tested"] == t["back"] and status["running"] == []
    assert status["queue"] == {"bench-box": {"done": 6}}
    engine.dispose()
