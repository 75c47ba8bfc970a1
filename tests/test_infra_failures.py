"""Infrastructure failures are not the commit's: a full disk, a missing build tool.

The disk is a real, small tmpfs mounted for the test (the tests run as root) under the
cache directory's parent, so checkouts, builds and the artifact cache all live on it; a
filler file takes its room away and gives it back. Real git repositories, real builds, real
PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import git
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.builders import InfraFailure, make_builder
from abwatch.builders.cache import ArtifactCache
from abwatch.service.cli.demo import Step, make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.config import load_config
from abwatch.service.store import db
from abwatch.service.store.models import (
    AlertDelivery, Build, BuildStatus, Comparison, Job, Run, RunStatus, WatchedCommit,
)

pytestmark = pytest.mark.slow  # real builds, mounts and processes

MB = 2**20


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs at ``tmp_path/disk``, unmounted after the test whatever happens."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0755", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """A filler file that leaves about ``leave_bytes`` free on ``disk``."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave_bytes))
    return filler


def write_config(tmp_path: Path, repo: Path, cache: Path, build: str, extra: str = "",
                 command: str = '["./bench", "3"]') -> str:
    path = tmp_path / "abwatch.toml"
    path.write_text(f"""
cache_dir = {json.dumps(str(cache))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = {build}
artifacts = "out"
[[workloads]]
name = "loop"
command = {command}
[run]
repetitions = 4
max_repetitions = 4
timeout_s = 30
noise_aware = false
[stats]
threshold_pct = 50.0
[runner]
device = "disk-box"
[cache]
min_free_gb = 0.004
{extra}
""")
    return str(path)


# The build writes 24 MB of scratch next to the sources (as a compiler's objects would), then builds.
SCRATCH_BUILD = '["sh", "-c", "head -c 25165824 /dev/zero > scratch.o && rm scratch.o && sh build.sh"]'


def test_a_build_on_a_full_disk_leaves_the_commit_untested_and_the_next_pass_tests_it(
        tmp_path, small_disk, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),))
    config = write_config(tmp_path, repo, small_disk / "cache", SCRATCH_BUILD, '[github]\nrepo = "o/r"')
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # the baseline builds
    make_demo_repo(repo, (Step("next", "Reword the README", work=200_000, note="words"),))
    sha = git.Repo(repo).tags["next"].commit.hexsha

    filler = fill(small_disk, 12 * MB)  # room for the floor (4 MB), not for the build's 24 MB of scratch
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 5
    err = capsys.readouterr().err
    assert "infrastructure failure" in err and "out of disk space" in err and sha[:12] in err, err
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        watched = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert watched[sha].status == "queued"  # untested, not build_failed
        assert "out of disk space" in watched[sha].reason
        assert session.scalar(select(Build).where(Build.status == BuildStatus.BUILD_FAILED)) is None
        job = session.scalars(select(Job).where(Job.dedupe_key.like(f"%{sha}"))).one()
        assert job.status == "failed" and job.error.startswith("Untested: infrastructure failure")
        states = [d.payload["state"] for d in session.scalars(
            select(AlertDelivery).where(AlertDelivery.webhook.like("github:%")).order_by(AlertDelivery.id))
            if d.payload["sha"] == sha]
        assert states == ["pending", "pending"]  # queued, then "not tested yet"; never an `error`
        run = session.scalars(select(Run).order_by(Run.id.desc())).first()
        assert run.status == RunStatus.FAILED and "out of disk space" in run.error

    filler.unlink()  # the space is back: the next pass takes the commit up again and tests it
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    assert "queued again after Untested: infrastructure failure" in capsys.readouterr().err
    with Session(engine) as session:
        watched = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert watched[sha].status == "ok" and watched[sha].run_id is not None
        assert session.get(Run, watched[sha].run_id).status == RunStatus.COMPLETED
        assert session.scalars(select(Job).where(Job.dedupe_key.like(f"%{sha}"))).one().status == "done"
        states = [d.payload["state"] for d in session.scalars(
            select(AlertDelivery).where(AlertDelivery.webhook.like("github:%")).order_by(AlertDelivery.id))
            if d.payload["sha"] == sha]
        assert states == ["pending", "pending", "success"]
    engine.dispose()


def test_compare_on_a_full_disk_exits_5_without_blaming_the_commit(tmp_path, small_disk, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),
                          Step("next", "Reword the README", work=200_000, note="words")))
    config = write_config(tmp_path, repo, small_disk / "cache", SCRATCH_BUILD)
    # the mirror first (its clone needs room too), then the disk is filled
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "base",
                 "--db", sqlite_url]) in (0, 4)
    fill(small_disk, 12 * MB)
    capsys.readouterr()
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "next",
                 "--db", sqlite_url]) == 5
    err = capsys.readouterr().err
    assert "infrastructure failure (not the commit's" in err and "out of disk space" in err, err
    assert str(small_disk) in err  # the directory that is short of space is named
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        assert session.scalar(select(Build).where(Build.status == BuildStatus.BUILD_FAILED)) is None
    engine.dispose()


# The workload writes 8 MB of scratch to its private TMPDIR (as a compiled model's files would).
SCRATCH_WORKLOAD = '["sh", "-c", "head -c 8388608 /dev/zero > \\"$TMPDIR/scratch\\" && ./bench 3"]'


def test_a_measurement_on_a_full_disk_leaves_the_commit_untested_and_the_next_pass_tests_it(
        tmp_path, small_disk, fresh_pg_url, capsys, monkeypatch):
    # the workloads' temporary directories live on the small disk too (TMPDIR's file system)
    (small_disk / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk / "tmp"))
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),))
    config = write_config(tmp_path, repo, small_disk / "cache", '["sh", "build.sh"]', '[github]\nrepo = "o/r"',
                          command=SCRATCH_WORKLOAD)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # the baseline builds
    make_demo_repo(repo, (Step("next", "Reword the README", work=200_000, note="words"),))
    sha = git.Repo(repo).tags["next"].commit.hexsha
    # both sides built (and measured) while there is room: the watch's pass below builds nothing
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "next",
                 "--db", fresh_pg_url]) == 0

    filler = fill(small_disk, 2 * MB)  # below the floor (4 MB), and no room for the workload's 8 MB
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 5
    err = capsys.readouterr().err
    assert "infrastructure failure" in err and "out of disk space" in err and sha[:12] in err, err
    assert "loop: " in err and str(small_disk) in err  # the workload and the full file system are named
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        watched = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert watched[sha].status == "queued" and "out of disk space" in watched[sha].reason
        run = session.scalars(select(Run).order_by(Run.id.desc())).first()
        assert run.status == RunStatus.FAILED and "out of disk space" in run.error
        assert session.scalar(select(Comparison).where(Comparison.run_id == run.id)) is None  # no verdict stored
        states = [d.payload["state"] for d in session.scalars(
            select(AlertDelivery).where(AlertDelivery.webhook.like("github:%")).order_by(AlertDelivery.id))
            if d.payload["sha"] == sha]
        assert "error" not in states and "failure" not in states and states[-1] == "pending"

    filler.unlink()  # the space is back: the next pass measures the commit
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    with Session(engine) as session:
        watched = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert watched[sha].status == "ok" and watched[sha].run_id is not None
        assert session.get(Run, watched[sha].run_id).status == RunStatus.COMPLETED
    engine.dispose()


def test_a_workload_that_fills_the_disk_itself_is_still_its_commits_failure(tmp_path, small_disk, sqlite_url,
                                                                          capsys, monkeypatch):
    # its scratch (60 MB) never fits the 48 MB disk; once it has failed, its TMPDIR is gone and
    # the disk has room again: the failure is the commit's, not an infrastructure failure
    (small_disk / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk / "tmp"))
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),))
    greedy = '["sh", "-c", "head -c 62914560 /dev/zero > \\"$TMPDIR/scratch\\" && ./bench 3"]'
    config = write_config(tmp_path, repo, small_disk / "cache", '["sh", "build.sh"]', command=greedy)
    capsys.readouterr()
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "base",
                 "--db", sqlite_url]) not in (0, 5)
    err = capsys.readouterr().err
    assert "infrastructure failure" not in err and re.search(r"loop: (control|treatment) invocation \d+ error", err), err
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.status == RunStatus.INCOMPLETE and "loop" in run.error
    engine.dispose()


def test_the_free_space_floor_refuses_a_build_naming_the_directory_and_the_figures(tmp_path, small_disk):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),))
    config = load_config(write_config(tmp_path, repo, small_disk / "cache", '["sh", "build.sh"]'))
    config = config.model_copy(update={"cache": config.cache.model_copy(update={"min_free_gb": 0.5})})
    builder = make_builder(config)
    sha = builder.resolve("base").sha
    with pytest.raises(InfraFailure) as caught:
        builder.build(sha)
    message = str(caught.value)
    assert "not enough free disk space" in message and "cache.min_free_gb = 0.5 GB" in message
    assert str(small_disk / "cache" / "artifacts") in message and " GB free" in message
    assert not [p for p in (small_disk / "cache" / "artifacts").glob(f"{sha[:12]}*") if p.is_dir()]  # not built


def test_a_missing_build_tool_is_the_machines_failure(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (Step("base", "Baseline", work=200_000),))
    config = write_config(tmp_path, repo, tmp_path / "cache", '["abwatch-no-such-compiler", "build.sh"]')
    capsys.readouterr()
    assert main(["compare", "--config", config, "--control", "base", "--treatment", "base",
                 "--db", sqlite_url]) == 5
    err = capsys.readouterr().err
    assert "'abwatch-no-such-compiler' is not installed on this machine" in err, err
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        assert session.scalar(select(Build)) is None  # no build row blames the commit
    engine.dispose()


def test_the_cache_evicts_least_recently_used_entries_to_max_size_and_free_space(tmp_path, small_disk):
    cache = ArtifactCache(small_disk / "artifacts")
    for key in ("k1", "k2", "k3"):
        source = tmp_path / key
        source.mkdir()
        (source / "blob").write_bytes(os.urandom(6 * MB))
        with cache.lock(key):
            cache.put(key, source, {"sha": key})
    assert {k for _, k in cache.entries()} == {"k1", "k2", "k3"}
    cache.get("k1")  # used now: k2 is the least recently used
    assert cache.make_room(13 * MB, 0, keep={"k3"}) == ["k2"]
    # the free-space floor: k1 goes too (k3 is kept), however small the size limit's demand
    free = cache.free_bytes()
    assert cache.make_room(None, free + 5 * MB, keep={"k3"}) == ["k1"]
    assert cache.free_bytes() >= free + 5 * MB
    assert {k for _, k in cache.entries()} == {"k3"}
