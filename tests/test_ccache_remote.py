"""The shared compiler cache: tvm-source build hosts behind one Redis (ccache's remote storage).

Real git, CMake, Ninja, ccache and compiler on the TVM-shaped project of ``test_tvm_source``
(here with a header both sources include); real Redis: the server on 127.0.0.1:6379
(``scripts/test.sh`` starts one; database ``REDIS_DB``) and a password-protected
``redis-server`` each test that needs one starts; real PostgreSQL and SQLite for the rows.
Each module's sources hold a fresh nonce, so the keys its builds write are new in Redis (no
earlier run's entry can turn a miss into a hit), and the keys it made are deleted after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import git
import pytest
import requests

from abwatch.builders import TvmSourceBuilder
from abwatch.builders.compiler_cache import parse_stats, with_password
from abwatch.builders.spec import remote_storage_url
from abwatch.service.cli.main import main
from abwatch.service.compare.building import build_commits
from abwatch.service.compare.driver import masked_config
from abwatch.service.config import Config, ConfigError, load_config
from abwatch.service.store import db
from abwatch.service.store.models import Build
from tests.conftest import free_port, live_server, wait_listening
from tests.test_tvm_source import CMAKELISTS, COMPILER, FAKE_REMOTE, PYTHON, RUNTIME, _commit, run_python

REDIS = ("127.0.0.1", 6379)
REDIS_DB = 11  # the tests' database on the shared server
SHAPE = '#define SHAPE {n}\nstatic const char shape_nonce[] __attribute__((used)) = "{nonce}";\n'
USES_SHAPE = '#include "shape.h"\nextern "C" int {name}_shape() {{ return SHAPE; }}\n'
COMPILES = 2  # runtime.cc and compiler.cc: both include shape.h


def redis_cli(*args: str, port: int = REDIS[1], password: str | None = None) -> str:
    """``redis-cli`` on 127.0.0.1:``port`` (the server's own client, as an operator would use it)."""
    env = dict(os.environ, REDISCLI_AUTH=password) if password else None
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=30, check=True, env=env).stdout


def ccache_keys(port: int = REDIS[1], db_number: int = REDIS_DB, password: str | None = None) -> set[str]:
    """The ccache entries in one Redis database."""
    out = redis_cli("-n", str(db_number), "--scan", "--pattern", "ccache:*", port=port, password=password)
    return set(out.split())


@pytest.fixture(scope="module")
def shared_redis():
    """The Redis server on 127.0.0.1:6379 (it must be running: the tests never skip); the ccache
    keys this module's builds added to ``REDIS_DB`` are deleted after it."""
    assert redis_cli("ping").strip() == "PONG", "no Redis on 127.0.0.1:6379 (scripts/test.sh starts one)"
    before = ccache_keys()
    yield f"redis://127.0.0.1:6379/{REDIS_DB}"
    made = sorted(ccache_keys() - before)
    for start in range(0, len(made), 500):
        redis_cli("-n", str(REDIS_DB), "del", *made[start:start + 500])


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test's own with a password: ``(port, password)``; stopped after."""
    password = f"p@ss:w/rd%{uuid.uuid4().hex[:12]}"  # characters a URL must encode
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", password],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_listening(port)
        yield port, password
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(repo path, mirrors dir, {name: sha}): the TVM-shaped project whose two sources include
    ``shape.h``; ``header`` changes that header, ``next`` (after it) only Python."""
    root = tmp_path_factory.mktemp("shared-ccache")
    nonce = uuid.uuid4().hex
    ffi = git.Repo.init(root / "mirrors" / "tvm-ffi", initial_branch="main")
    (Path(ffi.working_dir) / "include").mkdir()
    (Path(ffi.working_dir) / "include" / "tvmffi_magic.h").write_text("#define FFI_MAGIC 42\n")
    ffi_sha = _commit(ffi, "ffi header")
    repo = git.Repo.init(root / "tvm", initial_branch="main")
    work = Path(repo.working_dir)
    (work / "src").mkdir()
    (work / "python" / "tvmshaped").mkdir(parents=True)
    (work / "CMakeLists.txt").write_text(CMAKELISTS)
    (work / "src" / "shape.h").write_text(SHAPE.format(n=7, nonce=nonce))
    (work / "src" / "runtime.cc").write_text(RUNTIME + USES_SHAPE.format(name="runtime"))
    (work / "src" / "compiler.cc").write_text(COMPILER.format(v=1) + USES_SHAPE.format(name="compiler"))
    (work / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON.format(doc=""))
    (work / ".gitmodules").write_text(f'[submodule "3rdparty/tvm-ffi"]\n\tpath = 3rdparty/tvm-ffi\n'
                                      f"\turl = {FAKE_REMOTE}tvm-ffi\n")
    repo.git.update_index("--add", "--cacheinfo", f"160000,{ffi_sha},3rdparty/tvm-ffi")
    shas = {"first": _commit(repo, "first")}
    (work / "src" / "shape.h").write_text(SHAPE.format(n=8, nonce=nonce))
    shas["header"] = _commit(repo, "a header both sources include")
    (work / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON.format(doc=" Python-only change."))
    shas["next"] = _commit(repo, "python only, after the header change")
    return work, root / "mirrors", shas


def make_config(project, cache: Path, cmake: str = 'USE_LLVM = "OFF"', **build: str) -> Config:
    """A tvm-source config of ``project`` whose artifacts and ccache live in ``cache`` (one build
    host), written to ``<cache>.toml`` beside it (the file the CLI reads); ``build``: more string keys."""
    work, mirrors, _ = project
    path = cache.parent / f"{cache.name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""
cache_dir = {json.dumps(str(cache))}
[repo]
url = {json.dumps(str(work))}
[build]
kind = "tvm-source"
cmake = {{{cmake}}}
python_packages = []
check_import = "tvmshaped"
submodule_rewrites = {{{json.dumps(FAKE_REMOTE)} = {json.dumps(str(mirrors) + "/")}}}
""" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in build.items()) + """
[[workloads]]
name = "ls"
command = ["ls", "lib"]
""")
    return load_config(path)


def build_and_store(config: Config, url: str, ref: str) -> Build:
    """Build ``ref`` as a build host does (``build_commits``), into the database at ``url``; its row."""
    engine = db.open_database(url, write=True)
    try:
        with db.session_scope(engine) as session:
            [outcome] = build_commits(session, TvmSourceBuilder(config), [ref])
            row = session.get(Build, outcome.build_id)
            session.expunge(row)
            return row
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_second_build_host_takes_the_first_hosts_compiles_from_redis(project, shared_redis, tmp_path,
                                                                       sqlite_url, fresh_pg_url, capsys):
    """Host A compiles; host B (its own cache_dir, its own database here: one database keeps one
    row per artifact) builds the same commit from Redis, then a header change A compiled alone."""
    _, _, shas = project
    host_a = make_config(project, tmp_path / "host-a", ccache_remote=shared_redis)
    host_b = make_config(project, tmp_path / "host-b", ccache_remote=shared_redis)
    a_first = build_and_store(host_a, sqlite_url, shas["first"])
    assert a_first.status.value == "success"
    assert a_first.metrics["ccache_misses"] == COMPILES and a_first.metrics["ccache_remote_hits"] == 0
    assert a_first.metrics["ccache_remote_state"] == "used" and a_first.metrics["ccache_remote_errors"] == 0
    assert f"ccache: remote storage {shared_redis}" in a_first.log

    b_first = build_and_store(host_b, fresh_pg_url, shas["first"])
    assert b_first.metrics["incremental"] is False  # host B compiled the commit itself ...
    assert b_first.metrics["ccache_remote_hits"] == COMPILES  # ... every compile a hit from Redis
    assert b_first.metrics["ccache_misses"] == 0 and b_first.metrics["ccache_local_hits"] == 0
    assert b_first.metrics["ccache_hit_rate"] == 1.0

    # the header change: host A compiles it; host B's later commit (after it) takes it from Redis
    a_header = build_and_store(host_a, sqlite_url, shas["header"])
    assert a_header.metrics["ccache_misses"] == COMPILES and a_header.metrics["ccache_remote_hits"] == 0
    b_next = build_and_store(host_b, fresh_pg_url, shas["next"])
    assert b_next.metrics["incremental"] is True and b_next.metrics["steps"] >= COMPILES
    assert b_next.metrics["ccache_remote_hits"] == COMPILES and b_next.metrics["ccache_misses"] == 0
    artifact = TvmSourceBuilder(host_b).build(shas["next"])
    assert artifact.cached and run_python(artifact.path, "import tvmshaped; print(tvmshaped._lib.compiler_shape())"
                                          ).strip() == "8"

    # shown: `abwatch builds`, `abwatch cache` and the build page
    assert main(["builds", "--json", "--db", fresh_pg_url]) == 0
    listed = {b["id"]: b for b in json.loads(capsys.readouterr().out)}
    assert listed[b_next.id]["compiler_cache"]["remote_hits"] == COMPILES
    assert listed[b_next.id]["compiler_cache"]["summary"] == "0 local + 2 remote hits, 0 misses (100%)"
    assert main(["builds", "--db", fresh_pg_url]) == 0
    assert "0 local + 2 remote hits, 0 misses" in capsys.readouterr().out
    config_b = tmp_path / "host-b.toml"
    assert main(["cache", "--config", str(config_b), "--db", fresh_pg_url, "--json"]) == 0
    compiler = json.loads(capsys.readouterr().out)["compiler_cache"]
    assert compiler["remote"] == shared_redis and compiler["remote_reachable"] is True
    assert [b["compiler_cache"]["remote_hits"] for b in compiler["builds"]] == [COMPILES, COMPILES]
    assert compiler["lifetime"]["remote_hits"] >= 2 * COMPILES  # host B's ccache counted both builds
    assert main(["cache", "--config", str(config_b), "--db", fresh_pg_url]) == 0
    text = capsys.readouterr().out
    assert f"remote storage {shared_redis}: reachable" in text and "compiler cache of the newest" in text
    with live_server(fresh_pg_url, tmp_path / "server") as base:
        page = requests.get(f"{base}/builds/{b_next.id}", timeout=30)
        api = requests.get(f"{base}/api/builds/{b_next.id}", timeout=30).json()
        assert requests.get(f"{base}/builds/999999", timeout=30).status_code == 404
    assert page.status_code == 200 and "<th>remote hits</th><td class=\"num\">2</td>" in page.text
    assert f"{shared_redis}: used" in page.text
    assert api["compiler_cache"]["remote_hits"] == COMPILES and api["compiler_cache"]["local_hits"] == 0


@pytest.mark.slow
def test_unreachable_redis_builds_on_the_local_cache_and_says_so(project, tmp_path, sqlite_url, capsys):
    _, _, shas = project
    closed = f"redis://127.0.0.1:{free_port()}/{REDIS_DB}"  # nothing listens there
    config = make_config(project, tmp_path / "host", ccache_remote=closed)
    row = build_and_store(config, sqlite_url, shas["first"])
    assert row.status.value == "success"
    assert f"ccache: remote storage {closed} is unreachable" in row.log and "local cache only" in row.log
    assert row.metrics["ccache_remote_state"] == "unreachable" and row.metrics["ccache_remote_hits"] == 0
    assert row.metrics["ccache_misses"] == COMPILES
    artifact = TvmSourceBuilder(config).build(shas["first"])
    assert run_python(artifact.path, "import tvmshaped; print(tvmshaped.version())").strip() == "43"
    # the local cache still serves a second configuration of the same commit
    other = make_config(project, tmp_path / "host", 'USE_LLVM = "OFF", X = "1"', ccache_remote=closed)
    assert TvmSourceBuilder(other).build(shas["first"]).metrics["ccache_local_hits"] == COMPILES
    assert main(["builds", "--db", sqlite_url]) == 0
    assert "remote unreachable: local cache only" in capsys.readouterr().out


@pytest.mark.slow
def test_the_password_comes_from_the_environment_and_is_never_shown(project, private_redis, tmp_path,
                                                                     sqlite_url, monkeypatch, capsys):
    _, _, shas = project
    port, password = private_redis
    monkeypatch.setenv("ABWATCH_TEST_REDIS_PASSWORD", password)
    remote = f"redis://127.0.0.1:{port}/3"
    options = {"ccache_remote": remote, "ccache_remote_password_env": "ABWATCH_TEST_REDIS_PASSWORD"}
    host_a = make_config(project, tmp_path / "host-a", **options)
    a = build_and_store(host_a, sqlite_url, shas["first"])
    assert a.metrics["ccache_remote_state"] == "used" and a.metrics["ccache_remote_errors"] == 0
    assert len(ccache_keys(port, 3, password)) >= COMPILES  # written to the password-protected server
    b = TvmSourceBuilder(make_config(project, tmp_path / "host-b", **options)).build(shas["first"])
    assert b.metrics["ccache_remote_hits"] == COMPILES

    # a wrong password: the server refuses every request; the build succeeds on the local cache
    monkeypatch.setenv("ABWATCH_TEST_REDIS_PASSWORD", "wrong-" + password)
    c = build_and_store(make_config(project, tmp_path / "host-c", **options), sqlite_url, shas["header"])
    assert c.status.value == "success" and c.metrics["ccache_remote_state"] == "failed"
    assert c.metrics["ccache_remote_errors"] >= 1 and c.metrics["ccache_remote_hits"] == 0
    assert "those compiles used the local cache only" in c.log

    # neither password is in the stored config of a run, a log, a row, or what the CLI prints
    for secret in (password, "wrong-" + password):
        assert secret not in json.dumps(masked_config(host_a)) and secret not in a.log + c.log
        for stored in Path(sqlite_url.removeprefix("sqlite:///")).parent.glob("abwatch.db*"):
            assert secret.encode() not in stored.read_bytes()
    assert main(["builds", "--log", str(c.id), "--db", sqlite_url]) == 0
    assert main(["cache", "--config", str(tmp_path / "host-a.toml"), "--db", sqlite_url, "--json"]) == 0
    shown = capsys.readouterr().out
    assert "used the local cache only" in shown and password not in shown


def test_remote_storage_urls_are_checked_before_any_build():
    assert remote_storage_url("redis://cache:6379/0|connect-timeout=500") == "redis://cache:6379/0|connect-timeout=500"
    for bad, why in [("redis://:hunter2@cache:6379", "holds no password"),
                     ("http://u:hunter2@cache/ccache", "holds no password"),
                     ("s3://bucket/ccache", "expected redis://"),
                     ("redis://cache:port", "is not a URL"),
                     ("redis://cache/zero", "database number"),
                     ("http://cache/c|bearer-token=abc", "ccache_remote_password_env"),
                     ("redis://cache $HOME", "no spaces")]:
        with pytest.raises(ValueError, match=why):
            remote_storage_url(bad)


def test_a_config_names_the_password_variable_and_keeps_its_cache_key(project, tmp_path):
    plain = make_config(project, tmp_path / "plain")
    shared = make_config(project, tmp_path / "shared", ccache_remote="redis://cache:6379/2",
                         ccache_remote_password_env="CCACHE_REDIS_PASSWORD")
    # the shared compiler cache does not change what is built: same config hash, same cache keys
    assert plain.build.config_hash() == shared.build.config_hash()
    assert "CCACHE_REDIS_PASSWORD" in shared.secret_variables()
    with pytest.raises(ConfigError, match="password"):
        make_config(project, tmp_path / "user", ccache_remote="redis://alice@cache:6379")


def test_the_password_goes_where_ccache_reads_it():
    assert with_password("redis://cache:6379/2", None) == "redis://cache:6379/2"
    assert with_password("redis://cache:6379/2", "plain-Pass_1") == "redis://plain-Pass_1@cache:6379/2"
    # ccache decodes a lone user part before splitting it at ':': such a password goes as Redis's own user's
    assert with_password("redis://cache/2|connect-timeout=500", "a:b@c") == \
        "redis://default:a%3Ab%40c@cache/2|connect-timeout=500"
    assert with_password("redis://alice@cache", "s3cret") == "redis://alice:s3cret@cache"
    assert with_password("http://bob@cache:8080/ccache", "p w") == "http://bob:p%20w@cache:8080/ccache"
    assert with_password("http://cache:8080/ccache", "tok|en") == "http://cache:8080/ccache|bearer-token=tok%7Cen"


def test_hits_are_told_apart_from_cache_counters():
    text = ("direct_cache_hit\t3\npreprocessed_cache_hit\t1\ncache_miss\t2\nremote_storage_hit\t3\n"
            "remote_storage_error\t1\nremote_storage_timeout\t1\nlocal_storage_hit\t1\n")
    stats = parse_stats(text)
    assert (stats.local_hits, stats.remote_hits, stats.misses, stats.remote_errors) == (1, 3, 2, 2)
    assert stats.hit_rate == pytest.approx(4 / 6)
    assert parse_stats("").hit_rate is None


# Sent from inside the sandbox, as a hostile build would: a write and a read through the relay.
RELAY_PROBE = """
import socket, sys
def ask(*parts):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    s.sendall(b"*%d\\r\\n" % len(parts) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(p), p) for p in parts))
    answer = s.recv(4096); s.close(); return answer
print("SET", ask(b"SET", b"ccache:poison", b"evil"))
print("FLUSHALL", ask(b"FLUSHALL"))
print("GET", ask(b"GET", b"ccache:good"))
"""


def test_a_build_reads_the_shared_cache_through_abwatch_and_cannot_write_it(private_redis, tmp_path):
    from abwatch.builders import sandbox
    from abwatch.builders.ccache_relay import ReadOnlyRelay, upload
    from abwatch.builders.procs import child_env, run_process
    from abwatch.builders.sandbox import Sandbox

    port, password = private_redis
    remote = f"redis://127.0.0.1:{port}/2"
    redis_cli("-n", "2", "set", "ccache:good", "entry", port=port, password=password)
    rules = sandbox.policy()
    relay = ReadOnlyRelay(remote, password, (rules.uid, rules.gid) if rules.uid is not None else None)
    try:
        assert password not in relay.storage()  # what the build's ccache is told: a socket, no password
        proc = run_process([sys.executable, "-c", RELAY_PROBE, relay.path], cwd=tmp_path, env=child_env(),
                           timeout_s=60, sandbox=Sandbox(build=True))
    finally:
        relay.close()
    assert "SET b'-ERR abwatch: the shared compiler cache is read-only" in proc.stdout, proc.stdout + proc.stderr
    assert "FLUSHALL b'-ERR" in proc.stdout and "GET b'$5\\r\\nentry" in proc.stdout
    assert relay.refused == 2
    assert ccache_keys(port, 2, password) == {"ccache:good"}  # nothing written, nothing flushed
    # what a build's ccache wrote to its outbox is stored by abwatch, links and foreign names left
    outbox = tmp_path / "cache" / "outbox"
    outbox.mkdir(parents=True)
    (outbox / "0814d3f3af32fa392dd76c042c1473532c695904").write_bytes(b"\x00compiled")
    (outbox / "77b3b9dabe24ec4131e3113438315197fdad9c18").symlink_to("/etc/passwd")
    (outbox / "CACHEDIR.TAG").write_text("tag")
    assert upload(remote, password, tmp_path, "cache/outbox") == (1, 9)
    assert ccache_keys(port, 2, password) == {"ccache:good", "ccache:0814d3f3af32fa392dd76c042c1473532c695904"}
