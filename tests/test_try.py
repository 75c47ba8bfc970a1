"""Try jobs: a person who suspects a commit asks the watch's devices to compare it, through
``abwatch try`` or ``POST /api/jobs``; a worker of that device runs it (a real git history of
the C benchmark, real builds and runs, a real queue on SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import git
import pytest
import requests

from abwatch.service.cli.main import main
from abwatch.service.config import load_config
from abwatch.service.store import db
from abwatch.service.watch import daemon, queue
from tests.conftest import free_port
from tests.test_watch import write_watch_config

pytestmark = pytest.mark.slow  # real builds and runs


def run_queue(url: str, config_path: str, device: str = "bench-box") -> None:
    """What a worker of ``device`` does: take its jobs until none is left."""
    engine = db.make_engine(url)
    worker = queue.Worker(engine, device, daemon.handlers(load_config(config_path)))
    try:
        while worker.run_one() is not None:
            pass
    finally:
        worker.close()
        engine.dispose()


def test_try_from_the_cli_is_run_by_the_devices_worker(tmp_path, bench_repo, db_url, capsys):
    tags = {t.name: t.commit.hexsha for t in git.Repo(bench_repo).tags}
    config = write_watch_config(tmp_path, bench_repo, "", threshold_pct=5.0)
    assert main(["try", "--config", config, "--control", "base", "--treatment", "slower", "--verify",
                 "--json", "--db", db_url]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["kind"] == "try" and job["status"] == "queued" and job["device"] == "bench-box"
    assert (job["payload"]["control"], job["payload"]["treatment"]) == (tags["base"], tags["slower"])  # shas, pinned
    run_queue(db_url, config)
    assert main(["status", "--json", "--db", db_url]) == 0
    (done,) = json.loads(capsys.readouterr().out)["try_jobs"]
    assert done["id"] == job["id"] and done["status"] == "done", done
    result = done["result"]
    assert result["verdicts"] == {"loop": "regression"} and result["verify_run_id"] > result["run_id"]
    capsys.readouterr()
    assert main(["show", str(result["run_id"]), "--json", "--db", db_url]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["results"][0]["regression_id"] and shown["builds"][1]["sha"] == tags["slower"]
    assert main(["regressions", "--json", "--db", db_url]) == 0
    (regression,) = json.loads(capsys.readouterr().out)
    assert regression["state"] == "regress" and regression["treatment_sha"] == tags["slower"]


@contextlib.contextmanager
def serving(config: str, url: str, log):
    """``abwatch serve`` with the watch's config, as a process; its base URL once it answers."""
    port = free_port()
    env = dict(os.environ, ABWATCH_API_TOKEN="try-token")
    proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "serve", "--config", config,
                             "--db", url, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    # minutes on a heavily loaded host (over a minute beside six busy loops), as conftest's live_server
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    try:
        while True:
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):  # not listening, or slow to answer
                if requests.get(f"{base}/openapi.json", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, f"abwatch serve did not start: {log.name}"
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class Client:
    """requests against one base URL."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str) -> requests.Response:
        return requests.get(self.base + path, timeout=30)

    def post(self, path: str, **kw) -> requests.Response:
        return requests.post(self.base + path, timeout=30, **kw)


def test_try_through_the_api_needs_the_token_and_names_its_run(tmp_path, bench_repo, sqlite_url):
    config_path = write_watch_config(tmp_path, bench_repo, "", threshold_pct=5.0)
    db.upgrade(sqlite_url)
    with (tmp_path / "serve.log").open("w") as log, serving(config_path, sqlite_url, log) as base:
        check_api(Client(base), config_path, sqlite_url)


def check_api(client: Client, config_path: str, sqlite_url: str) -> None:
    body = {"control": "base", "treatment": "noop", "workloads": ["loop"], "who": "someone"}
    assert client.post("/api/jobs", json=body).status_code == 401
    token = {"Authorization": "Bearer try-token"}
    bad = client.post("/api/jobs", json={**body, "treatment": "no-such-ref"}, headers=token)
    assert bad.status_code == 422 and "no-such-ref" in bad.text
    assert client.post("/api/jobs", json={**body, "device": "elsewhere"}, headers=token).status_code == 422
    queued = client.post("/api/jobs", json=body, headers=token)
    assert queued.status_code == 201, queued.text
    job_id = queued.json()["id"]
    assert client.get(f"/api/jobs/{job_id}").json()["status"] == "queued"
    run_queue(sqlite_url, config_path)
    done = client.get(f"/api/jobs/{job_id}").json()
    assert done["status"] == "done" and done["result"]["verdicts"]["loop"] in ("same", "unknown")
    run = client.get(f"/api/runs/{done['result']['run_id']}")
    assert run.status_code == 200 and run.json()["results"][0]["workload"] == "loop"
    assert client.get("/api/jobs/999999").status_code == 404
    page = client.get(f"/jobs/{job_id}")  # the dashboard's job page, and the overview's list
    assert page.status_code == 200 and f'href="/runs/{done["result"]["run_id"]}"' in page.text
    assert f'href="/jobs/{job_id}"' in client.get("/").text
