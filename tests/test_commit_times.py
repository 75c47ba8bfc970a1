"""Any commit time git accepts is stored as it is, on both databases: offsets up to +-99:59
(PostgreSQL's timestamptz stops at 15:59), dates before 1970 (GitPython writes them; GitPython's
own parse reads them as 1970-01-01) and far in the future. A commit that still cannot be
stored (a time past year 9999) is a skipped step of a bisection, which goes on around it and
still names the culprit; an unfinished bisection is taken up again by the next pass.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import git
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.builders.repo import RepoMirror
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.store import db
from abwatch.service.store.models import BisectionStep, Commit, Regression
from abwatch.service.store.rows import get_commit, get_repository
from abwatch.service.watch.controls import week_start
from tests.test_hostile_git import literal_commit
from tests.test_watch import shas, step, write_watch_config


def redate(repo_path, tag: str, when: str) -> str:
    """Give HEAD (tagged ``tag``) the author and committer time ``when`` with plain ``git commit``."""
    repo = git.Repo(repo_path)
    repo.git.commit("--amend", "--no-edit", "--date", when, env={"GIT_COMMITTER_DATE": when})
    repo.git.tag("-f", tag)
    return repo.head.commit.hexsha


def test_every_time_git_accepts_is_stored_as_it_is(tmp_path, db_url):
    path = tmp_path / "repo"
    repo = git.Repo.init(path, initial_branch="main")
    (path / "f").write_text("1")
    repo.index.add(["f"])
    # GitPython writes a date before 1970 as negative seconds (git's own CLI refuses to)
    moon = repo.index.commit("moon", author_date="1969-07-20T20:17:00", commit_date="1969-07-20T20:17:00").hexsha
    (path / "f").write_text("2")
    repo.index.add(["f"])
    repo.index.commit("zone")
    plus23 = redate(path, "plus23", "2026-01-07T12:00:00 +2300")  # accepted by git fsck
    far = literal_commit(path, b"far zone and far future\n", b"F <f@x>", b"253402300799", "far")  # 9999-12-31
    body = (f"tree {repo.git.rev_parse('HEAD^{tree}')}\nparent {far}\nauthor Z <z@x> 1767700000 +9959\n"
            "committer Z <z@x> 1767700000 -9959\n\nwidest offsets\n").encode()
    widest = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=path, input=body,
                            capture_output=True, check=True).stdout.decode().strip()
    fsck = subprocess.run(["git", "fsck"], cwd=path, capture_output=True, text=True)
    assert [line for line in (fsck.stdout + fsck.stderr).splitlines()
            if "error" in line and moon not in line] == []  # git accepts them all but the 1969 one
    mirror = RepoMirror(str(path), tmp_path / "cache")
    expected = {
        moon: (datetime(1969, 7, 20, 20, 17, tzinfo=UTC), 0),
        plus23: (datetime(2026, 1, 6, 13, 0, tzinfo=UTC), 23 * 60),
        far: (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), 0),
        widest: (datetime.fromtimestamp(1767700000, UTC), -(99 * 60 + 59)),
    }
    engine = db.make_engine(db_url)
    db.ensure_schema(engine)
    with Session(engine) as session:
        repository = get_repository(session, str(path))
        for sha in expected:
            get_commit(session, repository, mirror.resolve(sha))
        session.commit()
    with Session(engine) as session:  # read back in a new session: what the database holds
        for sha, (instant, offset) in expected.items():
            row = session.scalars(select(Commit).where(Commit.sha == sha)).one()
            stored = row.committed_at if row.committed_at.tzinfo else row.committed_at.replace(tzinfo=UTC)
            assert (stored, row.committed_offset_min) == (instant, offset), sha
    engine.dispose()
    assert mirror.resolve(plus23).local_time() == "2026-01-07 12:00:00 +2300"
    # the week-start rule's week comes from the same reading: 1969's week, not 1970's
    assert week_start(mirror.committed_at(moon)) == datetime(1969, 7, 14, tzinfo=UTC)


def test_a_row_stored_without_its_offset_is_completed_when_met_again(tmp_path, sqlite_url):
    path = tmp_path / "repo"
    make_demo_repo(path, (step("base", "Baseline"),))
    sha = redate(path, "base", "2026-01-07T12:00:00 +2300")
    engine = db.make_engine(sqlite_url)
    db.ensure_schema(engine)
    with Session(engine) as session:  # as an abwatch before 0020 left it on SQLite: the wall clock alone
        session.add(Commit(repository_id=get_repository(session, str(path)).id, sha=sha, summary="Baseline",
                           author="a", committed_at=datetime(2026, 1, 7, 12, 0)))
        session.commit()
    with Session(engine) as session:
        row = get_commit(session, get_repository(session, str(path)), RepoMirror(str(path), tmp_path / "c").resolve(sha))
        session.commit()
        assert (row.committed_at.replace(tzinfo=UTC), row.committed_offset_min) == (
            datetime(2026, 1, 6, 13, 0, tzinfo=UTC), 1380)
    engine.dispose()


@pytest.mark.slow
def test_a_plus_23_commit_and_an_unstorable_one_inside_a_bisection_range(tmp_path, db_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0  # the baseline
    make_demo_repo(repo, (step("n1", "README", note="n1"),))
    # the range's first middle: a commit no date can hold (past year 9999), skipped; the next
    # middle: a +23:00 commit, once a DataError on PostgreSQL that failed the job for good
    unstorable = literal_commit(repo, b"a date no platform can hold\n", b"Odd <o@d>", b"99999999999999999999999",
                                "unstorable")
    make_demo_repo(repo, (step("plus23", "README", note="plus23"),))
    plus23 = redate(repo, "plus23", "2026-01-07T12:00:00 +2300")
    make_demo_repo(repo, (step("slow", "Do 25% more work", 1.25), step("n4", "README", 1.25, note="n4")))
    tags = shas(repo)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 1  # confirmed, bisected
    assert "DataError" not in capsys.readouterr().err
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        regression = session.scalars(select(Regression)).one()
        assert regression.state.value == "regress" and regression.culprit_commit.sha == tags["slow"]
        steps = {s.commit.sha: s for s in session.scalars(select(BisectionStep))}
        assert steps[unstorable].side.value == "skip" and steps[unstorable].run_id is None
        assert steps[plus23].side.value == "good" and steps[plus23].run_id is not None
        assert any(unstorable[:12] in e.reason and "cannot be read" in e.reason for e in regression.events)
        row = session.scalars(select(Commit).where(Commit.sha == plus23)).one()
        assert row.committed_offset_min == 1380
    engine.dispose()


@pytest.mark.slow
def test_an_unfinished_bisection_is_taken_up_by_the_next_pass(tmp_path, db_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    nightly = 'schedule = "0 2 * * *"\ntimezone = "UTC"'
    config = write_watch_config(tmp_path, repo, nightly + "\nbisect = false", threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    make_demo_repo(repo, (step("n1", "README", note="n1"), step("slow", "Do 25% more work", 1.25),
                          step("n2", "README", 1.25, note="n2")))
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 1  # confirmed, not bisected
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        assert session.scalars(select(Regression)).one().culprit_commit_id is None
    # the same watch with bisection on (same progress: [watch] is not part of its identity);
    # no new commit, yet the pass takes the confirmed regression up again and names its culprit
    write_watch_config(tmp_path, repo, nightly, threshold_pct=5.0)
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    assert "queued again (1 of 3)" in capsys.readouterr().err
    with Session(engine) as session:
        regression = session.scalars(select(Regression)).one()
        assert regression.culprit_commit.sha == shas(repo)["slow"]
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0
    assert "queued again" not in capsys.readouterr().err  # nothing left unfinished
    engine.dispose()


@pytest.mark.slow
def test_compare_takes_a_plus_23_commit_on_postgresql(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"), step("plus23", "README", note="plus23")))
    plus23 = redate(repo, "plus23", "2026-01-07T12:00:00 +2300")
    config = write_watch_config(tmp_path, repo, "", threshold_pct=5.0)
    # once exit 5 (DataError: time zone displacement out of range)
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "plus23",
                 "--db", fresh_pg_url]) == 0  # the same work: no regression
    assert "DataError" not in capsys.readouterr().err
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        row = session.scalars(select(Commit).where(Commit.sha == plus23)).one()
        assert (row.committed_at, row.committed_offset_min) == (datetime(2026, 1, 6, 13, 0, tzinfo=UTC), 1380)
    engine.dispose()
