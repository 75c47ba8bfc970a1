"""Device hosts on a network: ``abwatch worker --device`` processes in network namespaces of their
own (own address, own hostname, own ``cache_dir``), PostgreSQL reached over the veth network
(tests/netns.py), a real C history, real ``kill -9`` and a real link taken down.

The effects are +25 % on the process's CPU clock, as in tests/test_watch_workers.py, so the
verdicts hold on a busy 2-core machine with both devices' benchmarks sharing it.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import git
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.store import db
from abwatch.service.store.build_jobs import BUILD_QUEUE
from abwatch.service.store.models import Build, Comparison, Device, Invocation, Job, Regression, Run, RunStatus
from tests.netns import Host, Network, missing
from tests.test_fleet import THREE as FLEET_HISTORY, build_host_serving, built, host_config as fleet_config
from tests.test_watch_workers import HISTORY, all_done, jobs, wait_for, write_config
from tests.webdav import WebDav

pytestmark = pytest.mark.slow  # real namespaces, builds, runs and processes

@pytest.fixture
def network():
    """A bridge with PostgreSQL forwarded onto it; skipped (with the reason) where namespaces cannot be made."""
    why_not = missing()
    if why_not:
        pytest.skip(why_not)
    with Network() as net:
        net.forward(5432)
        yield net


def host_config(tmp_path: Path, repo: Path, name: str) -> Path:
    """The watch config as ``name`` has it: its own cache_dir."""
    base = write_config(tmp_path, repo, watch='start = "base"\ndevices = ["box-a", "box-b"]', samples=60)
    own = tmp_path / name
    own.mkdir()
    text = base.read_text().replace(json.dumps(str(tmp_path / "cache")), json.dumps(str(own / "cache")))
    path = own / "watch.toml"
    path.write_text(text)
    return path


def start(host: Host, config: Path, url: str, device: str, log: Path):
    """``abwatch worker --device`` on ``host``."""
    return host.popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", str(config),
                       "--db", url, "--device", device], log)


def mid_run(engine, device: str):
    """A predicate: the id of ``device``'s running run once it has stored three invocations."""
    def check():
        with Session(engine) as session:
            run = session.scalar(select(Run.id).where(Run.status == RunStatus.RUNNING, Run.device.has(name=device)))
            done = session.scalar(select(func.count()).select_from(Invocation).where(Invocation.run_id == run))
            return run is not None and done >= 3 and run
    return check


def test_two_device_hosts_on_a_network_survive_a_kill_and_a_cut_link(tmp_path, fresh_pg_url, network):
    repo = tmp_path / "repo"
    make_demo_repo(repo, HISTORY[:1] + HISTORY[2:3])  # base, slow25
    tags = {t.name: t.commit.hexsha for t in git.Repo(repo).tags}
    # the watch pass on the services side queues each device's jobs; the hosts work them
    controller = host_config(tmp_path, repo, "controller")
    assert main(["watch", "--config", str(controller), "--once", "--no-work", "--db", fresh_pg_url]) == 0
    engine = db.make_engine(fresh_pg_url)
    remote_url = fresh_pg_url.replace("127.0.0.1", network.address)
    hosts = {device: network.host(f"host-{device[-1]}") for device in ("box-a", "box-b")}
    configs = {device: host_config(tmp_path, repo, hosts[device].name) for device in hosts}
    logs = {device: tmp_path / f"{device}.log" for device in hosts}
    for device, host in hosts.items():
        start(host, configs[device], remote_url, device, logs[device])

    # box-b's host dies mid-measurement (every process at once), then comes back
    killed = wait_for("box-b mid-run", mid_run(engine, "box-b"), logs=list(logs.values()))
    hosts["box-b"].kill_all()
    start(hosts["box-b"], configs["box-b"], remote_url, "box-b", logs["box-b"])
    # box-a's link goes down mid-measurement for longer than the keepalive, then up again
    cut = wait_for("box-a mid-run", mid_run(engine, "box-a"), logs=list(logs.values()))
    hosts["box-a"].cut()
    time.sleep(20)
    hosts["box-a"].restore()

    wait_for("every job to finish", lambda: all_done(engine), deadline_s=900, logs=list(logs.values()))
    finished = jobs(engine)
    assert all(j.status == "done" for j in finished), [(j.id, j.device, j.error) for j in finished]
    with Session(engine) as session:
        runs = list(session.scalars(select(Run)))
        by_id = {r.id: r for r in runs}
        assert by_id[killed].status == RunStatus.ABANDONED  # the killed host's run, said as such
        # the cut host either kept its sessions (a short outage) or lost them and its run was
        # abandoned and done again: never left running, never counted twice
        assert by_id[cut].status in (RunStatus.COMPLETED, RunStatus.ABANDONED)
        assert not [r for r in runs if r.status == RunStatus.RUNNING]
        completed = [r for r in runs if r.status == RunStatus.COMPLETED]
        keys = [(r.device.name, r.control_commit.sha, r.treatment_commit.sha, r.run_type.value) for r in completed]
        assert len(keys) == len(set(keys)), keys  # nothing measured twice to completion
        assert {r.device.name for r in completed} == {"box-a", "box-b"}
        # each run was made by a worker of its device's own host: its hostname, not the machine's
        for run in completed:
            assert run.host == hosts[run.device.name].name, (run.id, run.host)
        assert {j.worker.partition(":")[0] for j in finished} == {"host-a", "host-b"}
        regressions = list(session.scalars(select(Regression)))
        assert {r.device.name for r in regressions if r.state == RegressionState.REGRESS} == {"box-a", "box-b"}
        assert {r.culprit_commit.sha for r in regressions if r.culprit_commit} <= {tags["slow25"]}
        retried = session.scalar(select(Job).where(Job.device == "box-b", Job.attempts == 2))
        assert retried is not None  # the job the dead host held was queued again and taken up
    engine.dispose()
    # each host built in its own cache (no build host here: each device host still builds)
    for device in hosts:
        assert any((configs[device].parent / "cache" / "artifacts").iterdir())



def test_a_build_host_and_two_device_hosts_on_a_network(tmp_path, fresh_pg_url, network):
    """Three hosts, each its own namespace, address, hostname and cache_dir; PostgreSQL and the
    artifact store (nginx) reached over the veth network. Each commit is built once, on the build
    host; the device hosts fetch and never compile; box-b's link goes down mid-measurement and
    comes back; both devices' verdicts are stored."""
    repo = tmp_path / "repo"
    make_demo_repo(repo, FLEET_HISTORY)
    counts = tmp_path / "counts"
    counts.mkdir()
    store = WebDav(tmp_path / "store").start()
    try:
        remote_store = store.url.replace(f"127.0.0.1:{store.port}", network.forward(store.port))
        remote_url = fresh_pg_url.replace("127.0.0.1", network.address)
        configs = {name: fleet_config(tmp_path, name, repo, remote_store, counts) for name in ("builder", "dev-a", "dev-b")}
        assert main(["watch", "--config", str(configs["builder"]), "--once", "--no-work", "--db", fresh_pg_url]) == 0
        engine = db.make_engine(fresh_pg_url)
        hosts = {name: network.host(f"host-{name}") for name in configs}
        logs = {name: tmp_path / f"{name}.log" for name in configs}
        worker = [sys.executable, "-m", "abwatch.service.cli.main", "worker", "--db", remote_url, "--config"]
        hosts["builder"].popen([*worker, str(configs["builder"]), "--builds"], logs["builder"])
        # the device hosts start once it serves (started first, one builds what it needs itself)
        wait_for("the build host's registration", lambda: build_host_serving(engine), 120, list(logs.values()))
        for name, device in (("dev-a", "box-a"), ("dev-b", "box-b")):
            hosts[name].popen([*worker, str(configs[name]), "--device", device], logs[name])
        wait_for("box-b mid-run", mid_run(engine, "box-b"), 600, list(logs.values()))
        hosts["dev-b"].cut()
        time.sleep(15)
        hosts["dev-b"].restore()
        wait_for("every job done", lambda: all_done(engine), 900, list(logs.values()))
        everything = jobs(engine)
        assert [j for j in everything if j.status != "done"] == [], [(j.kind, j.device, j.error) for j in everything]
        shas = {j.payload["sha"] for j in everything if j.device == BUILD_QUEUE}
        assert len(shas) == len(FLEET_HISTORY)
        assert built(counts) == Counter({sha: 1 for sha in shas})  # the build command ran once per commit
        with Session(engine) as session:
            builds = session.scalars(select(Build)).all()
            assert len(builds) == len(shas) and len({b.artifact_key for b in builds}) == len(shas)
            verdicts = session.execute(select(Device.name, Comparison.verdict).join(Run, Run.id == Comparison.run_id)
                                       .join(Device, Device.id == Run.device_id)).all()
            assert {name for name, _ in verdicts} == {"box-a", "box-b"} and all(v for _, v in verdicts)
            completed = [r for r in session.scalars(select(Run)) if r.status == RunStatus.COMPLETED]
            assert {r.host for r in completed} == {"host-dev-a", "host-dev-b"}  # measured on the device hosts
            keys = [(r.device.name, r.control_commit.sha, r.treatment_commit.sha, r.run_type.value) for r in completed]
            assert len(keys) == len(set(keys))  # nothing measured twice to completion
        assert {j.worker.partition(":")[0] for j in everything if j.device == BUILD_QUEUE} == {"host-builder"}
        for name in ("dev-a", "dev-b"):  # the device hosts fetched over the network and compiled nothing
            assert "fetched" in logs[name].read_text()
            assert not (tmp_path / name / "checkouts").exists()
        engine.dispose()
    finally:
        store.stop()
