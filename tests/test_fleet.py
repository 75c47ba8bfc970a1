"""A fleet of real processes on one PostgreSQL queue and one nginx WebDAV store: a build host
(``abwatch worker --builds``) and two device hosts (``abwatch worker --device``), each with a
cache_dir of its own, over a small C history; then ``kill -9`` of a build host mid-build.

The build command appends the commit to a file outside its sandboxed checkout before it
compiles, so every run of it, on any host, is counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.store import db
from abwatch.service.store.build_jobs import BUILD_QUEUE
from abwatch.service.store.models import (
    ArtifactManifest, Build, BuildStatus, Comparison, Device, DeviceHost, Job, Run, WatchedCommit,
)

from test_watch_workers import HISTORY, stop, wait_for
from webdav import WebDav

pytestmark = pytest.mark.slow  # real builds, benchmarks, processes and servers

THREE = HISTORY[:3]  # base, noop, slow25


def host_config(tmp_path: Path, name: str, repo: Path, store: str, counts: Path) -> Path:
    """One host's config: the fleet's settings, its own cache_dir."""
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / name))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "-c", "echo $ABWATCH_COMMIT >> {counts}/builds; if [ -e {counts}/slow ]; then sleep 60; fi; sh build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
command = ["./bench", "10"]
[run]
repetitions = 10
max_repetitions = 10  # the fleet's jobs are the point: any verdict, no extra looks on a busy host
timeout_s = 60
noise_aware = false
[stats]
threshold_pct = 2.0
[sandbox]
writable = [{json.dumps(str(counts))}]
[artifacts]
store = {json.dumps(store)}
[watch]
start = "base"
devices = ["box-a", "box-b"]
heartbeat_s = 2
""")
    return path


def start(config: Path, url: str, log: Path, *args: str) -> subprocess.Popen:
    """``abwatch worker`` as a process of its own (a host)."""
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", str(config),
                                 "--db", url, *args], stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def fleet(tmp_path, fresh_pg_url):
    repo = tmp_path / "repo"
    make_demo_repo(repo, THREE)
    counts = tmp_path / "counts"
    counts.mkdir()
    store = WebDav(tmp_path / "store").start()
    engine = db.make_engine(fresh_pg_url)
    procs: list[subprocess.Popen] = []
    yield repo, counts, store, engine, procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    store.stop()
    engine.dispose()


def built(counts: Path) -> Counter:
    """How many times the build command ran, per commit."""
    path = counts / "builds"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def build_host_serving(engine) -> bool:
    """Whether a build host has registered: a device host started before that would find no build
    host serving and build what it needs itself, as it should (service/compare/shared.py)."""
    with Session(engine) as session:
        return session.scalar(select(DeviceHost.id).where(DeviceHost.name == BUILD_QUEUE)) is not None


def jobs(engine, device: str | None = None) -> list[Job]:
    with Session(engine) as session:
        query = select(Job).order_by(Job.id)
        return list(session.scalars(query if device is None else query.where(Job.device == device)))


@pytest.mark.parametrize("build_host", [True, False], ids=["build-host", "no-build-host"])
def test_two_device_hosts_each_commit_built_once(tmp_path, fleet, fresh_pg_url, build_host):
    """With a build host the device hosts only fetch; without one they build what they need
    themselves, yet each commit once: the other device host waits for it and fetches it."""
    repo, counts, store, engine, procs = fleet
    configs = {name: host_config(tmp_path, name, repo, store.url, counts) for name in ("builder", "dev-a", "dev-b")}
    assert main(["watch", "--config", str(configs["builder"]), "--once", "--no-work", "--db", fresh_pg_url]) == 0
    assert len(jobs(engine, BUILD_QUEUE)) == 3  # one build job per commit, whatever the number of devices
    assert len(jobs(engine, "box-a")) == len(jobs(engine, "box-b")) == 3
    logs = {name: tmp_path / f"{name}.log" for name in configs}
    if build_host:
        procs.append(start(configs["builder"], fresh_pg_url, logs["builder"], "--builds"))
        wait_for("the build host's registration", lambda: build_host_serving(engine), 180, list(logs.values()))
    procs.append(start(configs["dev-a"], fresh_pg_url, logs["dev-a"], "--device", "box-a"))
    procs.append(start(configs["dev-b"], fresh_pg_url, logs["dev-b"], "--device", "box-b"))
    wait_for("every job done", lambda: all(j.status in ("done", "failed") for j in jobs(engine)),
             900, list(logs.values()))
    for proc in procs:
        assert stop(proc) == 0

    everything = jobs(engine)
    assert [j for j in everything if j.status != "done"] == [], [(j.kind, j.device, j.error) for j in everything]
    shas = {j.payload["sha"] for j in jobs(engine, BUILD_QUEUE)}
    # the build command ran once per commit (else what each host said of its builds, to tell why)
    assert built(counts) == Counter({sha: 1 for sha in shas}), "\n".join(
        f"{name}: {line}" for name, log in logs.items() if log.exists()
        for line in log.read_text().splitlines() if "build" in line or "fetched" in line or "store" in line)
    with Session(engine) as session:
        rows = session.scalars(select(Build)).all()
        assert len(rows) == 3 and all(r.status is BuildStatus.SUCCESS for r in rows)
        assert len({r.artifact_key for r in rows}) == 3  # one build row per artifact
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 3
        assert {c.status.value for c in session.scalars(select(WatchedCommit))} <= {"baseline", "ok", "failed"}
        verdicts = session.execute(select(Device.name, Comparison.verdict).join(Run, Run.id == Comparison.run_id)
                                   .join(Device, Device.id == Run.device_id)).all()
    assert {name for name, _ in verdicts} == {"box-a", "box-b"}  # both devices' verdicts stored
    assert all(verdict is not None for _, verdict in verdicts)
    if build_host:
        for name in ("dev-a", "dev-b"):  # the device hosts fetched, and never compiled anything
            assert "fetched" in logs[name].read_text()
            assert not (tmp_path / name / "checkouts").exists()
    else:  # each commit built by one device host and fetched by the other
        said = logs["dev-a"].read_text() + logs["dev-b"].read_text()
        assert said.count("  fetched ") == 3 and "no build host is serving" in said
    assert store.requests("PUT") == len(store.objects())  # each object sent once


def test_a_build_host_killed_mid_build_leaves_the_job_to_another(tmp_path, fleet, fresh_pg_url):
    repo, counts, store, engine, procs = fleet
    config = host_config(tmp_path, "builder", repo, store.url, counts)
    second = host_config(tmp_path, "builder-2", repo, store.url, counts)
    assert main(["watch", "--config", str(config), "--once", "--no-work", "--db", fresh_pg_url]) == 0
    (counts / "slow").touch()  # the builds sleep a minute before they compile
    logs = [tmp_path / "builder.log", tmp_path / "builder-2.log"]
    first = start(config, fresh_pg_url, logs[0], "--builds")
    procs.append(first)
    wait_for("a build under way", lambda: sum(built(counts).values()) == 1, 120, logs)
    victim = next(j for j in jobs(engine, BUILD_QUEUE) if j.status == "running")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    (counts / "slow").unlink()
    procs.append(start(second, fresh_pg_url, logs[1], "--builds"))
    wait_for("every build job done", lambda: all(j.status == "done" for j in jobs(engine, BUILD_QUEUE)), 300, logs)
    assert stop(procs[-1]) == 0

    taken = next(j for j in jobs(engine, BUILD_QUEUE) if j.id == victim.id)
    assert taken.attempts == 2 and taken.result["status"] == "success"
    assert taken.worker != victim.worker  # the second build host built it
    assert built(counts)[victim.payload["sha"]] == 2  # the killed build, and the one that finished
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Build)) == 3  # no row of the killed build
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 3
