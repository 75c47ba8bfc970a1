"""docker-compose.yml and the Dockerfile, checked without Docker (it is not on these machines).

The compose file is parsed (PyYAML) and its services' command lines are run as they are,
with their environment, outside Docker: the database host ``db`` becomes the test
PostgreSQL database, and each volume's mount point inside the container becomes a directory
of the test (the mounted config's paths are mapped the same way, after checking that they
lie on the volumes the compose file declares).
"""

from __future__ import annotations

import pytest
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import git
import yaml
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.config import load_config
from abwatch.service.store.models import Job, Regression, WatchedCommit

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

ROOT = Path(__file__).resolve().parents[1]
ABWATCH = str(Path(sys.executable).with_name("abwatch"))  # the console script the image's ENTRYPOINT runs


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def mounts(service: dict, tmp_path: Path) -> dict[str, Path]:
    """Container path -> the directory that stands in for it here (bind mounts: the real one)."""
    out = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        out[target] = (ROOT / source).resolve() if source.startswith(".") else tmp_path / "volumes" / source
    return out


def outside(value: str, mapping: dict[str, Path]) -> str:
    """``value`` with a container path replaced by the directory standing in for it."""
    for target, here in mapping.items():
        if value == target or value.startswith(target + "/"):
            return str(here) + value[len(target):]
    return value


def test_dockerfile_can_build_tvm_from_source():
    text = (ROOT / "Dockerfile").read_text()
    joined = text.replace("\\\n", " ")  # one line per instruction
    install = next(line for line in joined.splitlines() if "apt-get install" in line)
    packages = install.split("apt-get install", 1)[1].split("&&")[0].split()
    for needed in ("git", "g++", "gcc", "zlib1g-dev"):
        assert needed in packages, needed
    llvm = [p for p in packages if re.fullmatch(r"llvm-\d+-dev", p)]
    assert llvm, "an LLVM dev package (llvm-config, headers, libraries)"
    version = llvm[0].split("-")[1]
    assert f"LLVM_CONFIG=/usr/lib/llvm-{version}/bin/llvm-config" in text
    # CMake, Ninja (and ccache) come from PyPI through the `source` extra
    assert "pip install --no-cache-dir '.[source]'" in text
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {re.split(r"[<>=]", p)[0] for p in extras["source"]} >= {"cmake", "ninja"}
    for line in text.splitlines():  # everything the image copies exists
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert 'ENTRYPOINT ["abwatch"]' in text
    # the nightly TVM example uses the image's LLVM and is a valid config
    nightly = load_config(ROOT / "config" / "tvm-nightly.toml")
    assert nightly.build.kind == "tvm-source" and nightly.watch.schedule
    assert nightly.build.cmake["USE_LLVM"] == f"/usr/lib/llvm-{version}/bin/llvm-config"


def test_compose_file_is_wired_as_documented(tmp_path):
    spec = compose()
    services = spec["services"]
    assert {"db", "migrate", "demo-repo", "watch", "worker"} <= set(services)
    health = services["db"]["healthcheck"]["test"]
    assert health[:2] == ["CMD", "pg_isready"]
    for name in ("watch", "worker", "migrate"):
        assert services[name]["depends_on"]["db"] == {"condition": "service_healthy"}, name
    for name in ("watch", "worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["watch"]["command"][0] == "watch" and "--once" not in services["watch"]["command"]
    assert services["worker"]["command"][0] == "worker"
    # the URL names the database the db service creates, on the host `db`
    url = make_url(services["worker"]["environment"]["ABWATCH_DATABASE_URL"])
    db_env = services["db"]["environment"]
    assert (url.host, url.username, url.database) == ("db", db_env["POSTGRES_USER"], db_env["POSTGRES_DB"])
    assert re.search(r"ABWATCH_DATABASE_URL=" + re.escape(str(url)), (ROOT / "Dockerfile").read_text())
    # the mounted config exists and really uses the named volumes
    mapping = mounts(services["worker"], tmp_path)
    config_arg = services["worker"]["command"][services["worker"]["command"].index("--config") + 1]
    assert config_arg == services["watch"]["command"][services["watch"]["command"].index("--config") + 1]
    here = Path(outside(config_arg, mapping))
    assert here.is_file() and here.parent == ROOT / "config"
    raw = tomllib.loads(here.read_text())
    named = {v.split(":")[1]: v.split(":")[0] for v in services["worker"]["volumes"] if not v.startswith(".")}
    assert named.get(raw["cache_dir"]) == "cache" and "cache" in spec["volumes"]
    repo_volume = [t for t in named if raw["repo"]["url"].startswith(t + "/")]
    assert repo_volume and named[repo_volume[0]] in spec["volumes"]
    demo = services["demo-repo"]["command"]
    assert demo[0] == "demo-repo" and demo[1] == raw["repo"]["url"]
    assert raw["runner"]["device"]  # a fixed device name: a container's host name changes


def test_compose_commands_run_outside_docker(tmp_path, fresh_pg_url):
    services = compose()["services"]
    mapping = mounts(services["worker"], tmp_path)
    # the mounted config, its container paths mapped like the volumes
    config_arg = services["worker"]["command"][services["worker"]["command"].index("--config") + 1]
    source = Path(outside(config_arg, mapping))
    text = source.read_text()
    raw = tomllib.loads(text)
    for key in (raw["cache_dir"], raw["repo"]["url"]):
        assert outside(key, mapping) != key, f"{key} is on no volume"
        text = text.replace(f'"{key}"', f'"{outside(key, mapping)}"')
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / source.name).write_text(text)
    mapping[str(Path(config_arg).parent)] = etc
    test_url = make_url(fresh_pg_url)

    def run_args(name: str) -> tuple[list[str], dict]:
        service = services[name]
        env = dict(os.environ)
        for key, value in service["environment"].items():
            if key == "ABWATCH_DATABASE_URL":  # the host `db` is the test server here
                value = str(make_url(value).set(host=test_url.host, port=test_url.port,
                                               username=test_url.username, database=test_url.database)
                            .render_as_string(hide_password=False))
                assert value == test_url.render_as_string(hide_password=False)
            env[key] = value
        return [ABWATCH] + [outside(a, mapping) for a in service["command"]], env

    for one_shot in ("migrate", "demo-repo"):
        argv, env = run_args(one_shot)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (one_shot, done.stderr)
    logs = {name: tmp_path / f"{name}.log" for name in ("watch", "worker")}
    procs = {}
    engine = db.make_engine(fresh_pg_url)
    try:
        for name in ("watch", "worker"):
            argv, env = run_args(name)
            with logs[name].open("w") as out:  # the child keeps its own copy of the descriptor
                procs[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 400
        while True:
            with Session(engine) as session:
                found = list(session.scalars(select(Job)))
            if len(found) == 3 and all(j.status == "done" for j in found):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise AssertionError("\n".join(p.read_text()[-3000:] for p in logs.values()))
            time.sleep(0.5)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(timeout=60) for name, proc in procs.items()}
    assert codes == {"watch": 0, "worker": 0}, {n: p.read_text()[-2000:] for n, p in logs.items()}
    tags = {t.name: t.commit.hexsha for t in git.Repo(outside(raw["repo"]["url"], mapping)).tags}
    with Session(engine) as session:
        statuses = {w.commit.sha: w.status for w in session.scalars(select(WatchedCommit))}
        assert statuses == {tags["v1.0"]: "baseline", tags["v1.1"]: "ok", tags["v1.2"]: "ok"}
        for regression in session.scalars(select(Regression)):  # +10 % on wall time: never a wrong culprit
            if regression.culprit_commit is not None:
                assert regression.culprit_commit.sha == tags["v1.2"]
    # the cache is the `cache` volume's stand-in: mirrors and artifacts went there
    cache_here = Path(outside(raw["cache_dir"], mapping))
    assert (cache_here / "artifacts").is_dir() and any((cache_here / "artifacts").iterdir())
    assert shutil.which(ABWATCH)
    engine.dispose()


def test_compose_web_serves_the_api_with_the_token_from_the_environment(tmp_path, fresh_pg_url):
    import requests

    from tests.conftest import free_port

    services = compose()["services"]
    web = services["web"]
    assert web["ports"] == ["8000:8000"] and web["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert web["environment"]["ABWATCH_API_TOKEN"] == "${ABWATCH_API_TOKEN:-}"  # never a value in the file
    mapping = mounts(web, tmp_path)
    port = str(free_port())
    argv = [ABWATCH] + [port if a == "8000" else outside(a, mapping) for a in web["command"]]
    assert argv[1] == "serve" and "0.0.0.0" in argv
    env = dict(os.environ, ABWATCH_DATABASE_URL=fresh_pg_url, ABWATCH_API_TOKEN="compose-secret")
    assert subprocess.run([ABWATCH] + services["migrate"]["command"], env=env, timeout=300).returncode == 0
    log = tmp_path / "web.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            try:
                answer = requests.get(f"{base}/api/regressions", timeout=5)
                break
            except requests.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        assert answer.status_code == 200 and answer.json() == []
        assert requests.get(f"{base}/", timeout=10).status_code == 200  # the dashboard
        body = {"status": "acknowledged", "who": "ci"}
        assert requests.post(f"{base}/api/regressions/1/triage", json=body, timeout=10).status_code == 401
        authorized = requests.post(f"{base}/api/regressions/1/triage", json=body, timeout=10,
                                   headers={"Authorization": "Bearer compose-secret"})
        assert authorized.status_code == 404  # past the token: there is no regression 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
