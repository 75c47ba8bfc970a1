"""Commits that git accepts but a database or a parser may not: a NUL in the message, invalid
UTF-8 in the author, a date past what the platform can represent. Anyone who can push can make
them (``git hash-object -t commit --literally``); the watch must store what it can, skip what it
cannot with the reason, and go on testing the commits around them, on both databases.
"""

from __future__ import annotations

import pytest
import subprocess
import sys
import time

import git
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.core.commit_info import CommitInfo, storable
from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import (
    BisectionStep, Commit, Regression, Run, RunStatus, RunType, WatchedCommit,
)
from tests.test_watch import shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

ABWATCH = [sys.executable, "-m", "abwatch.service.cli.main"]


def literal_commit(repo_path, message: bytes, author: bytes, when: bytes, tag: str) -> str:
    """Put a hand-written commit object (same tree as HEAD) on top of the branch and tag it."""
    repo = git.Repo(repo_path)
    tree, parent = repo.git.rev_parse("HEAD^{tree}"), repo.head.commit.hexsha
    body = (b"tree " + tree.encode() + b"\nparent " + parent.encode() + b"\nauthor " + author + b" " + when
            + b" +0000\ncommitter abwatch example <example@abwatch.invalid> " + when + b" +0000\n\n" + message)
    sha = subprocess.run(["git", "hash-object", "-t", "commit", "--literally", "-w", "--stdin"], cwd=repo_path,
                         input=body, capture_output=True, check=True).stdout.decode().strip()
    repo.git.update_ref("refs/heads/main", sha)
    repo.git.reset("--hard", sha)
    repo.git.update_ref(f"refs/tags/{tag}", sha)  # `git tag` would parse the dates
    return sha


def test_storable_replaces_nul_surrogates_and_bounds_length():
    assert storable(b"evil \x00 bytes \xff", 100) == "evil \ufffd bytes \ufffd"
    assert storable("lone \udcff surrogate", 100) == "lone \ufffd surrogate"
    assert storable("x" * 50, 10) == "x" * 9 + "\u2026"
    info = CommitInfo(sha="a" * 40, summary="s\0s", author="n\udc80 <e>", committed_at=None)
    assert info.summary == "s\ufffds" and info.author == "n\ufffd <e>"


def test_watch_stores_odd_commits_skips_unreadable_ones_and_goes_on(tmp_path, db_url):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'control = "previous"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0  # the baseline
    make_demo_repo(repo, (step("before", "Reword the README", note="before"),))
    nul = literal_commit(repo, b"evil \x00 message\n\nbody \x00 too\n", b"Bad \xff\xfe Name <x@y>",
                         b"1767268800", "nul")
    overflow = literal_commit(repo, b"a date no platform can hold\n", b"Odd <o@d>",
                              b"99999999999999999999999", "overflow")
    make_demo_repo(repo, (step("after", "Reword the README again", note="after"),))
    tags = shas(repo)

    # a NUL once stopped every pass on PostgreSQL; now the pass tests every commit it can
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        rows = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert rows[tags["before"]].status == "ok" and rows[tags["after"]].status == "ok"
        assert rows[nul].status == "ok"  # stored with its text made storable, and tested
        stored = session.scalars(select(Commit).where(Commit.sha == nul)).one()
        assert stored.summary == "evil \ufffd message"
        assert "\ufffd" in stored.author and "\0" not in stored.author
        assert rows[overflow].status == "skipped"
        assert overflow[:12] in rows[overflow].reason and "cannot be read" in rows[overflow].reason
        # the commit after the skipped one was compared with the last good one
        assert rows[tags["after"]].control_sha == nul
    # a later pass over the same history neither fails nor takes anything up again
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    with Session(engine) as session:
        assert len(session.scalars(select(WatchedCommit)).all()) == 5
    engine.dispose()


def test_a_bisection_killed_mid_way_goes_on_from_its_stored_steps(tmp_path, db_url):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0  # the baseline
    make_demo_repo(repo, (step("n1", "README", note="n1"), step("n2", "README", note="n2"),
                          step("slow", "Do 25% more work", 1.25), step("n3", "README", 1.25, note="n3"),
                          step("n4", "README", 1.25, note="n4"), step("n5", "README", 1.25, note="n5")))
    engine = db.make_engine(db_url)

    def steps() -> list[BisectionStep]:
        with Session(engine) as session:
            return list(session.scalars(select(BisectionStep).order_by(BisectionStep.id)))

    proc = subprocess.Popen([*ABWATCH, "watch", "--config", config, "--once", "--db", db_url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not steps() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the watch ended before its first bisection step: {proc.stderr.read()}"
    proc.kill()
    proc.wait()
    proc.stderr.close()
    before = steps()
    assert before, "no bisection step was stored before the kill"

    # the next pass takes the job up again and finishes the bisection from the stored steps
    # (0: the regression was confirmed by the killed pass, before its bisection began)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    after = steps()
    pairs = [(s.regression_id, s.commit_id) for s in after]
    assert len(pairs) == len(set(pairs)), "a commit was stepped twice"
    assert [(s.id, s.run_id) for s in after[:len(before)]] == [(s.id, s.run_id) for s in before]
    tags = shas(repo)
    with Session(engine) as session:
        regression = session.scalars(select(Regression)).one()
        assert regression.culprit_commit.sha == tags["slow"]
        # every comparison of the bisection is one stored step's (or its bad-end ask's) run
        stepped = {s.commit_id for s in after}
        regress_runs = session.scalars(select(Run).where(Run.run_type == RunType.REGRESS,
                                                         Run.status == RunStatus.COMPLETED)).all()
        assert {r.treatment_commit_id for r in regress_runs if r.control_commit_id == regression.control_commit_id} \
            <= stepped
        assert len([r for r in regress_runs if r.control_commit_id == regression.control_commit_id]) == len(stepped)
    engine.dispose()
