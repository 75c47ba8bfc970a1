"""Device identity: a fingerprint per device stored with every run, a changed fingerprint a new
series (said), workers' registrations and heartbeats, one alert for a silent device, the
devices list of the API and the dashboard. Real PostgreSQL, real compares, real worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import requests
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from abwatch.core.device_identity import DeviceInfo, changes, digest, summary
from abwatch.runners import CpuRunner
from abwatch.runners.fingerprint import target_string
from abwatch.service.config import Config, load_config
from abwatch.service.notify import alerts
from abwatch.service.store import db
from abwatch.service.store.models import (
    AlertDelivery, Device, DeviceHost, Job, JobStatus, Regression, Run, utcnow,
)
from abwatch.service.store.rows import device_note, seen_device
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.watch import presence, queue
from conftest import live_server
from tests.test_compare import compare, run_cli


def info(name: str, **fingerprint) -> DeviceInfo:
    """A device description with this fingerprint."""
    return DeviceInfo(name=name, kind="cpu", hardware_config={"hostname": "h"}, software_config={},
                      fingerprint=fingerprint)


def test_the_fingerprint_is_the_documented_subset_and_says_what_changed():
    runner = CpuRunner()
    here = runner.prepare().fingerprint
    assert {"cpu_model", "cores", "memory_gib", "kernel", "target"} <= set(here)
    assert here["target"] == "llvm -mcpu=native" and isinstance(here["memory_gib"], int)
    assert here["cpu_flags"] == sorted(here["cpu_flags"])  # /proc/cpuinfo's, sorted
    assert "hostname" not in here and "pip" not in here  # a renamed host or a new package is the same device
    assert digest(here) == digest(dict(reversed(list(here.items()))))  # key order is no change
    runner.teardown()

    assert target_string({"kind": "llvm", "mtriple": "x86_64", "mattr": ["+avx2", "+fma"]}) == \
        "llvm -mattr=+avx2,+fma -mtriple=x86_64"
    assert target_string("  cuda   -arch=sm_90 ") == "cuda -arch=sm_90"
    old = {"cpu_model": "Xeon A", "cpu_flags": ["avx2", "sse4a"], "kernel": "6.1", "target": "llvm",
           "gpus": [{"name": "H100", "driver": "NVIDIA 550", "memory_gib": 80}]}
    new = {**old, "cpu_model": "Xeon B", "cpu_flags": ["avx2", "avx512f"],
           "gpus": [{"name": "H100", "driver": "NVIDIA 560", "memory_gib": 80}]}
    said = changes(old, new)
    assert said[0] == "cpu model Xeon A -> Xeon B"
    assert "cpu flags +avx512f -sse4a" in said
    assert "gpus H100 (NVIDIA 550, 80 GiB) -> H100 (NVIDIA 560, 80 GiB)" in said
    assert changes({}, new) == ["no fingerprint was stored before"]
    assert "Xeon B" in summary(new) and "2 cpu flags" in summary(new)


def test_a_device_row_per_fingerprint_and_a_legacy_row_taken_over(session):
    legacy = Device(name="box", kind="cpu", hardware_config={})  # stored before fingerprints: no hash
    session.add(legacy)
    session.flush()
    row, before = seen_device(session, info("box", cpu_model="A"))
    assert row.id == legacy.id and row.fingerprint_hash == digest({"cpu_model": "A"}) and before is None
    assert device_note(session, row, before) is None  # its runs stay its series
    other, before = seen_device(session, info("box", cpu_model="B"))
    assert other.id != row.id and before is not None and before.id == row.id
    note = device_note(session, other, before)
    assert note is not None and note.startswith("device box's fingerprint changed (cpu model A -> B; ")
    assert note.endswith(f"a new series starts (device row {other.id})")
    again, before = seen_device(session, info("box", cpu_model="B"))
    assert again.id == other.id and before is None  # the same hardware: the same row, nothing to say
    assert session.scalar(select(func.count()).select_from(Device).where(Device.name == "box")) == 2


CONFIG = """
cache_dir = {cache}
[repo]
url = {repo}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
kind = "command"
command = ["./bench", "10"]
[run]
repetitions = 4
warmup = 1
timeout_s = 30
seed = 7
noise_aware = false
max_repetitions = 40
[stats]
threshold_pct = 5.0
[runner]
device = "box"
{runner}
[watch]
{watch}
"""


def write_config(path: Path, repo: Path, cache: Path, runner: str = "", watch: str = "") -> Path:
    """A config of the C benchmark on device ``box``."""
    path.write_text(CONFIG.format(cache=json.dumps(str(cache)), repo=json.dumps(str(repo)), runner=runner,
                                  watch=watch))
    return path


def test_a_changed_fingerprint_starts_a_new_series_and_says_so(capsys, bench_repo, fresh_pg_url, tmp_path):
    """Another TVM target is another fingerprint of the same machine: the runs on it are a series
    of their own (device row, views, history), said once when it starts and when it comes back."""
    cache = tmp_path / "cache"
    first = write_config(tmp_path / "a.toml", bench_repo, cache)
    other = write_config(tmp_path / "b.toml", bench_repo, cache, runner='target = "llvm -mcpu=x86-64"')

    code, a, err = compare(capsys, first, fresh_pg_url, "base", "noop")
    assert code in (0, 1) and "fingerprint changed" not in err
    code, b, err = compare(capsys, other, fresh_pg_url, "base", "noop")
    assert code in (0, 1)
    assert "device box's fingerprint changed (target llvm -mcpu=native -> llvm -mcpu=x86-64; " in err
    assert "a new series starts" in err
    code, c, err = compare(capsys, other, fresh_pg_url, "noop", "slower")
    assert code in (0, 1) and "fingerprint changed" not in err  # said once, when the series starts
    code, d, err = compare(capsys, first, fresh_pg_url, "noop", "slower")
    assert code in (0, 1) and "fingerprint changed back (target llvm -mcpu=x86-64 -> llvm -mcpu=native; " in err
    assert "resumes" in err

    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        rows = list(session.scalars(select(Device).where(Device.name == "box").order_by(Device.id)))
        assert len(rows) == 2 and [r.fingerprint["target"] for r in rows] == ["llvm -mcpu=native", "llvm -mcpu=x86-64"]
        device_of = dict(session.execute(select(Run.id, Run.device_id)).all())
        assert device_of[a["run_id"]] == device_of[d["run_id"]] == rows[0].id
        assert device_of[b["run_id"]] == device_of[c["run_id"]] == rows[1].id
        # the views keep the two apart: a latest status and a series per fingerprint
        latest = session.execute(text("SELECT device_id, run_id FROM latest_status ORDER BY device_id")).all()
        assert [tuple(r) for r in latest] == [(rows[0].id, d["run_id"]), (rows[1].id, c["run_id"])]
        per_row = dict(session.execute(text(
            "SELECT device_id, count(DISTINCT sha) FROM workload_series GROUP BY device_id")).all())
        assert per_row == {rows[0].id: 3, rows[1].id: 3}  # base, noop, slower on each
    engine.dispose()

    # history on the device: one fingerprint, said, the other by --fingerprint
    code, payload, err = run_cli(capsys, "history", "loop", "--device", "box", "--all-branches", "--json",
                                 "--db", fresh_pg_url)
    assert code == 0 and payload["device_id"] == rows[0].id  # the newest measured
    assert "loop on box: 2 fingerprints" in err and "--fingerprint" in err
    code, payload, err = run_cli(capsys, "history", "loop", "--device", "box", "--all-branches", "--json",
                                 "--fingerprint", rows[1].fingerprint_hash[:8], "--db", fresh_pg_url)
    assert code == 0 and payload["device_id"] == rows[1].id and "fingerprints" not in err
    code, _, err = run_cli(capsys, "history", "loop", "--device", "box", "--fingerprint", "ffff", "--db", fresh_pg_url)
    assert code != 0 and "fingerprint 'ffff' names 0" in err
    code, payload, err = run_cli(capsys, "history", "loop", "--all-branches", "--json", "--db", fresh_pg_url)
    assert code == 0 and "measured on 2 devices or fingerprints, mixed" in err


def test_a_verify_on_a_changed_fingerprint_says_the_device_moved(capsys, bench_repo, fresh_pg_url, tmp_path):
    """A regression found on one fingerprint and verified after the device changed (here: the
    row that found it says an older kernel, as if the machine was upgraded since): the verdict
    stands on the hardware it ran on, and its reason says what changed."""
    config = write_config(tmp_path / "a.toml", bench_repo, tmp_path / "cache")
    code, found, err = compare(capsys, config, fresh_pg_url, "base", "slower")
    assert code == 1, err  # +20 % work
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        (device,) = session.scalars(select(Device))
        now = device.fingerprint["kernel"]
        device.fingerprint = {**device.fingerprint, "kernel": "5.10.0-old"}
        device.fingerprint_hash = digest(device.fingerprint)
        session.commit()
    code, _, err = run_cli(capsys, "verify", str(found["run_id"]), "--json", "--db", fresh_pg_url)
    assert code in (0, 1), err
    with Session(engine) as session:
        (regression,) = session.scalars(select(Regression))
        reason = regression.events[-1].reason
        assert regression.state in (RegressionState.REGRESS, RegressionState.CLEARED), reason
        assert f"measured on a changed device: kernel 5.10.0-old -> {now}" in reason, reason
        assert "found on the earlier one" in reason
    engine.dispose()


def test_a_device_left_unregistered_by_a_database_outage_is_registered_by_its_heartbeat(
        fresh_pg_url, tmp_path, bench_repo):
    """A worker that found the database down when it started hands its device to the heartbeat,
    whose next beat records the device's fingerprint and row."""
    db.upgrade(fresh_pg_url)
    config = watch_config(tmp_path, bench_repo, "heartbeat_s = 60")
    engine = db.make_engine(fresh_pg_url)
    beat = presence.DeviceHeartbeat(engine, ["box"], config, unregistered=["box"])
    beat.tick()
    with Session(engine) as session:
        device = session.scalar(select(Device).where(Device.name == "box"))
        assert device is not None and device.fingerprint["cores"] and device.fingerprint_hash
        assert session.scalar(select(DeviceHost).where(DeviceHost.name == "box")).heartbeat_at is not None
    assert beat.unregistered == []
    beat.tick()  # registered once: the next beats only beat
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Device).where(Device.name == "box")) == 1
    engine.dispose()


def watch_config(tmp_path: Path, repo: Path, watch: str, webhook: str | None = None) -> Config:
    """The config of a watch whose ``[watch]`` section is ``watch`` (and alerts to ``webhook``)."""
    text_ = CONFIG.format(cache=json.dumps(str(tmp_path / "cache")), repo=json.dumps(str(repo)), runner="",
                          watch=watch)
    if webhook:
        text_ += f"[alerts]\nwebhooks = [{json.dumps(webhook)}]\nbackoff_s = 0\n"
    path = tmp_path / "watch.toml"
    path.write_text(text_)
    return load_config(path)


class Receiver(BaseHTTPRequestHandler):
    """Collects the alerts POSTed to it."""

    received: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((self.headers["X-Abwatch-Event"], json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        """Quiet."""


def test_a_silent_device_is_alerted_exactly_once_and_its_return_said(fresh_pg_url, tmp_path, bench_repo):
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Receiver.received = []
    config = watch_config(tmp_path, bench_repo, 'stale_after = "10m"\nheartbeat_s = 60',
                          webhook=f"http://127.0.0.1:{server.server_port}/hook")
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    name = "silent-box"
    try:
        assert presence.register(engine, name, info(name, cpu_model="A"), None, config)
        with Session(engine) as session:
            queue.enqueue(session, "test", name, {"sha": "0" * 40}, f"{name}:1")
            session.commit()
        assert [line for line in presence.check_stale(engine, config) if name in line] == []  # it just beat
        with engine.begin() as connection:
            connection.execute(update(DeviceHost).where(DeviceHost.name == name)
                               .values(heartbeat_at=utcnow() - timedelta(hours=1)))
        # eight checkers at once (as many workers' heartbeats would): one alert
        said: list[str] = []
        checkers = [threading.Thread(target=lambda: said.extend(presence.check_stale(engine, config)))
                    for _ in range(8)]
        for t in checkers:
            t.start()
        for t in checkers:
            t.join()
        mine = [line for line in said if f"device {name} is silent" in line]
        assert len(mine) == 1 and "no heartbeat for 1h00m" in mine[0] and "1 job(s) wait for it" in mine[0]
        assert not [line for line in presence.check_stale(engine, config) if name in line]  # still silent: no more
        alerts.deliver_pending(engine, config.alerts)
        stale = [doc for event, doc in Receiver.received if event == "stale" and doc["device"]["name"] == name]
        assert len(stale) == 1 and stale[0]["device"]["queued"] == 1 and stale[0]["device"]["silent_s"] >= 3600
        assert stale[0]["device"]["fingerprint"] == digest({"cpu_model": "A"})

        # heard again: the mark is cleared and that is said, once
        back = presence.beat(engine, [name], config) + presence.beat(engine, [name], config)
        assert len(back) == 1 and back[0].startswith(f"abwatch: device {name} is back")
        alerts.deliver_pending(engine, config.alerts)
        assert [event for event, doc in Receiver.received if doc["device"]["name"] == name] == ["stale", "recovered"]
        with Session(engine) as session:
            row = session.scalar(select(DeviceHost).where(DeviceHost.name == name))
            assert row is not None and row.stale_since is None
            assert session.scalar(select(func.count()).select_from(AlertDelivery).where(
                AlertDelivery.payload["device"]["name"].as_string() == name)) == 2
        off = watch_config(tmp_path, bench_repo, 'stale_after = "off"')
        with engine.begin() as connection:
            connection.execute(update(DeviceHost).where(DeviceHost.name == name)
                               .values(heartbeat_at=utcnow() - timedelta(days=3)))
        assert presence.check_stale(engine, off) == []  # off: no alert, however long
    finally:
        server.shutdown()
        server.server_close()
        engine.dispose()


def test_stale_after_is_a_duration_longer_than_two_heartbeats(tmp_path, bench_repo):
    assert watch_config(tmp_path, bench_repo, "").watch.stale_after_s == 6 * 3600  # the default
    assert watch_config(tmp_path, bench_repo, 'stale_after = "90s"\nheartbeat_s = 30').watch.stale_after_s == 90
    assert watch_config(tmp_path, bench_repo, 'stale_after = "off"').watch.stale_after_s is None
    for bad in ('stale_after = "soon"', 'stale_after = "60s"\nheartbeat_s = 60'):
        with pytest.raises(Exception, match="stale_after"):
            watch_config(tmp_path, bench_repo, bad)


def _host(engine, name: str) -> DeviceHost | None:
    with Session(engine) as session:
        return session.scalar(select(DeviceHost).where(DeviceHost.name == name))


def test_a_worker_registers_its_fingerprint_beats_when_idle_and_alerts_a_silent_device(
        fresh_pg_url, tmp_path, bench_repo):
    """A real ``abwatch worker``: its device's fingerprint and heartbeats in PostgreSQL while it
    waits for jobs, another device that went silent alerted once by its heartbeat thread, and a
    clean stop recorded."""
    config = tmp_path / "worker.toml"
    config.write_text(CONFIG.format(cache=json.dumps(str(tmp_path / "cache")), repo=json.dumps(str(bench_repo)),
                                    runner="", watch='heartbeat_s = 0.3\nstale_after = "3s"'))
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    loaded = load_config(config)
    presence.register(engine, "gone-box", info("gone-box", cpu_model="old"), None, loaded)
    with engine.begin() as connection:
        connection.execute(update(DeviceHost).where(DeviceHost.name == "gone-box")
                           .values(heartbeat_at=utcnow() - timedelta(minutes=5)))
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", str(config),
                                   "--db", fresh_pg_url], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120  # a busy machine starts Python slowly
        beats: set = set()
        while time.monotonic() < deadline and (len(beats) < 3 or _stale_alerts(engine) == 0):
            row = _host(engine, "box")
            if row is not None:
                beats.add(row.heartbeat_at)
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        assert len(beats) >= 3, f"heartbeats seen: {beats}\n{log.read_text()}"
        row = _host(engine, "box")
        assert row is not None and row.device_id is not None and row.pid == worker.pid and row.stopped_at is None
        with Session(engine) as session:
            device = session.get(Device, row.device_id)
            assert device is not None and device.name == "box"
            assert device.fingerprint["target"] == "llvm -mcpu=native" and device.fingerprint_hash == \
                digest(device.fingerprint)
        time.sleep(1.5)  # several more beats and checks: still one alert
        assert _stale_alerts(engine) == 1, log.read_text()
        assert "device gone-box is silent" in log.read_text()
        assert f"device box: fingerprint {device.fingerprint_hash[:12]}" in log.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    row = _host(engine, "box")
    assert row is not None and row.stopped_at is not None  # stopped cleanly, said on its row
    engine.dispose()


def _stale_alerts(engine) -> int:
    """Devices marked silent (the alert is recorded with the mark; no webhook here)."""
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(DeviceHost).where(DeviceHost.stale_since.is_not(None)))


def test_the_devices_list_of_the_api_and_the_dashboard(fresh_pg_url, tmp_path, bench_repo):
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    config = watch_config(tmp_path, bench_repo, 'stale_after = "1h"')
    presence.register(engine, "gpu-box", info("gpu-box", cpu_model="Xeon", gpus=[
        {"name": "H100", "driver": "NVIDIA 550", "memory_gib": 80}], device_api="cuda"), None, config)
    presence.register(engine, "gpu-box", info("gpu-box", cpu_model="Xeon", gpus=[
        {"name": "H100", "driver": "NVIDIA 560", "memory_gib": 80}], device_api="cuda"), None, config)
    presence.register(engine, "old-box", info("old-box", cpu_model="Arm"), None, config)
    with Session(engine) as session:
        for n in range(3):
            queue.enqueue(session, "test", "gpu-box", {"sha": f"{n:040d}"}, f"k{n}")
        queue.enqueue(session, "test", "never-seen", {"sha": "1" * 40}, "k9")
        session.execute(update(Job).where(Job.dedupe_key == "k0").values(status=JobStatus.RUNNING))
        session.execute(update(DeviceHost).where(DeviceHost.name == "old-box")
                        .values(heartbeat_at=utcnow() - timedelta(hours=2)))
        session.commit()
    presence.check_stale(engine, config)
    with live_server(fresh_pg_url, tmp_path / "serve") as base:  # `abwatch serve`, a process of its own
        listed = {d["name"]: d for d in requests.get(f"{base}/api/devices", timeout=30).json()}
        page = requests.get(f"{base}/devices", timeout=30)
    assert set(listed) == {"gpu-box", "old-box", "never-seen"}
    gpu = listed["gpu-box"]
    assert gpu["state"] == "serving" and gpu["queued"] == 2 and gpu["running"] == 1 and gpu["silent_s"] < 600
    assert "NVIDIA 560" in gpu["fingerprint"]["summary"] and len(gpu["fingerprints"]) == 2
    assert "gpus H100 (NVIDIA 550, 80 GiB) -> H100 (NVIDIA 560, 80 GiB)" in gpu["message"]
    assert "a new series starts" in gpu["message"]
    assert listed["old-box"]["state"] == "stale" and listed["old-box"]["stale_since"] is not None
    assert listed["never-seen"]["state"] == "unserved" and listed["never-seen"]["queued"] == 1
    assert page.status_code == 200
    assert '<tr class="device" data-name="gpu-box">' in page.text and "NVIDIA 560" in page.text
    assert '<span class="badge stale">stale</span>' in page.text
    engine.dispose()
