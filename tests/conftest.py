"""Shared fixtures: a real PostgreSQL server, SQLite files, real git histories.

PostgreSQL is the server at ``$ABWATCH_TEST_POSTGRES_URL`` (default: the local one on
127.0.0.1:5432, database ``postgres``, used only to create and drop throw-away
databases). If it cannot be reached the tests that need it fail; they are never skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.demo import Step, make_demo_repo

# A machine with an NVIDIA GPU (the lent device machine): the tests that check the refusals
# where there is none do not apply there
NVIDIA_HERE = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
no_nvidia = pytest.mark.skipif(NVIDIA_HERE, reason="an NVIDIA GPU is here: this checks the refusal without one")

PG_ADMIN_URL = os.environ.get(
    "ABWATCH_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
WORK = 4_000_000  # ~4-5 ms a sample on this machine

# The test repository's history; each tag's behaviour is known exactly.
HISTORY = (
    Step("base", "Baseline", work=WORK),
    Step("noop", "Reword the README only", work=WORK, note="No code change."),
    Step("slower", "Do 20% more work", work=int(WORK * 1.2)),
    Step("faster", "Do 20% less work", work=int(WORK * 0.8)),
    Step("broken", "Break the build", work=WORK, broken=True),
    Step("flaky", "Read a slowdown factor from the environment", work=WORK, env_factor="FLAKY_SLOWDOWN"),
    Step("hang", "Hang forever", work=WORK, hang=True),
)


# Code under test runs as the sandbox's own host user (builders/sandbox.py), which must reach
# the files a test makes: pytest makes its directories 0700, so they are made enterable (not
# listable) by others, as a deployment's cache_dir is.
_mktemp, _getbasetemp = pytest.TempPathFactory.mktemp, pytest.TempPathFactory.getbasetemp


def _enterable_mktemp(self, basename: str, numbered: bool = True) -> Path:
    path = _mktemp(self, basename, numbered)
    path.chmod(0o711)
    return path


def _enterable_basetemp(self) -> Path:
    base = _getbasetemp(self)
    for directory in (base.parent, base):
        if directory.stat().st_uid == os.getuid():
            directory.chmod(0o711)
    return base


pytest.TempPathFactory.mktemp = _enterable_mktemp  # type: ignore[method-assign]
pytest.TempPathFactory.getbasetemp = _enterable_basetemp  # type: ignore[method-assign]


# Fixtures that make a test need the PostgreSQL server, and fixtures that make it slow (real
# builds, compares, TVM venvs, boards, servers): `pytest -m "not slow"` is the everyday subset.
POSTGRES_FIXTURES = frozenset({"pg_admin", "fresh_pg_url", "empty_pg_url", "pg_template", "migrated_pg_url",
                               "session", "filled_pg_url", "filled_server"})
SLOW_FIXTURES = frozenset({"tvm_python", "tvm_cache", "rpc_board", "filled_pg_url", "filled_server",
                           "bench_repo", "write_config"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test ``postgres`` and ``slow`` by the fixtures it uses (modules whose tests make
    their own histories and servers say ``slow`` themselves)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if names & POSTGRES_FIXTURES or "postgres" in (params.get("db_url"), params.get("empty_db_url")):
            item.add_marker(pytest.mark.postgres)
        if names & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


# The key that authenticates the shared store's manifests ([artifacts] manifest_key_env's default
# variable): every host of a test fleet has the same one, as a deployment's environment file gives it.
MANIFEST_KEY = "test-fleet-manifest-key-0123456789abcdef"


@pytest.fixture(autouse=True)
def manifest_key(monkeypatch) -> str:
    """Every test (and every process it starts) has the fleet's manifest key; a test about a host
    without it deletes the variable."""
    monkeypatch.setenv("ABWATCH_MANIFEST_KEY", MANIFEST_KEY)
    return MANIFEST_KEY


@pytest.fixture(scope="session")
def pg_admin():
    """An AUTOCOMMIT engine on the server's maintenance database."""
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    yield engine
    engine.dispose()


def _create_database(pg_admin, template: str | None = None) -> str:
    name = f"abwatch_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    # a copy of a migrated template is a file copy on the server: no migration to run again
    clause = f' TEMPLATE "{template}"' if template else ""
    with pg_admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"{clause}'))
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def _drop_database(pg_admin, url: str) -> None:
    name = make_url(url).database
    with pg_admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# Migrating a new database costs about a second of CPU (Alembic's batch mode reflects SQLite's
# tables), and most tests only need a database at head: they get a copy of one migrated once a
# session. Each pytest-xdist worker is its own process with its own session, so each makes its
# own template (named by its pid): no worker copies a template another one is still migrating.
# The tests of migrations themselves take the empty_* fixtures.


@pytest.fixture(scope="session")
def pg_template(pg_admin) -> str:
    """The name of a PostgreSQL database migrated to head once a session, the template of
    :func:`fresh_pg_url`'s; nothing connects to it after (CREATE DATABASE ... TEMPLATE needs that)."""
    url = _create_database(pg_admin)
    db.upgrade(url)
    yield make_url(url).database
    _drop_database(pg_admin, url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """An SQLite file migrated to head once a session, copied by :func:`sqlite_url`."""
    path = tmp_path_factory.mktemp("template") / "abwatch.db"
    db.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def empty_pg_url(pg_admin):
    """URL of a new, empty PostgreSQL database (for tests of migrating one), dropped after the test."""
    url = _create_database(pg_admin)
    yield url
    _drop_database(pg_admin, url)


@pytest.fixture
def fresh_pg_url(pg_admin, pg_template):
    """URL of a new PostgreSQL database at head (a copy of :func:`pg_template`), dropped after the test."""
    url = _create_database(pg_admin, pg_template)
    yield url
    _drop_database(pg_admin, url)


@pytest.fixture
def empty_sqlite_url(tmp_path) -> str:
    """URL of an SQLite file that does not exist yet (for tests of migrating one)."""
    return f"sqlite:///{tmp_path / 'abwatch.db'}"


@pytest.fixture
def sqlite_url(tmp_path, sqlite_template) -> str:
    """URL of a new SQLite file at head (a copy of :func:`sqlite_template`)."""
    path = tmp_path / "abwatch.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request):
    """A new database at head of each kind in turn."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "fresh_pg_url")


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db_url(request):
    """An empty database of each kind in turn (for tests of migrating one)."""
    return request.getfixturevalue("empty_sqlite_url" if request.param == "sqlite" else "empty_pg_url")


@pytest.fixture(scope="session")
def migrated_pg_url(pg_admin, pg_template):
    """One PostgreSQL database at head for the session, for rolled-back-transaction tests."""
    url = _create_database(pg_admin, pg_template)
    yield url
    _drop_database(pg_admin, url)


@pytest.fixture
def session(migrated_pg_url):
    """A session inside a transaction that is rolled back after the test."""
    engine = db.make_engine(migrated_pg_url)
    connection = engine.connect()
    outer = connection.begin()
    sess = Session(bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False)
    yield sess
    sess.close()
    outer.rollback()
    connection.close()
    engine.dispose()


TVM_RELEASES = ("0.26.0", "0.27.0.post1")  # the apache-tvm wheels the TVM tests compare


@pytest.fixture(scope="session")
def tvm_cache(tmp_path_factory):
    """This session's cache directory of the TVM tests, holding a venv of each of
    :data:`TVM_RELEASES`. The venvs are installed once a run, by the first pytest-xdist worker
    that needs them, in the run's shared directory, and hard-linked into each worker's own
    cache (a venv moves with its directory): installing them is a minute of CPU each on a busy
    host. Each worker keeps a path of its own, which tells its TVM workers from the other
    workers' (tests/test_tvm.py's ``no_workers_left``)."""
    from abwatch.builders import TvmWheelBuilder
    from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig

    cache = tmp_path_factory.mktemp("tvm-cache")
    (cache / "artifacts").mkdir()
    with across_workers(tmp_path_factory, "tvm-wheels") as shared:
        config = Config(build=TvmWheelBuildConfig(), cache_dir=shared / "tvm-wheels",
                        workloads=[TvmWorkloadConfig(name="x", model="builtin:mlp")])
        for release in TVM_RELEASES:
            built = TvmWheelBuilder(config).build(release).path
            subprocess.run(["cp", "-al", str(built), str(cache / "artifacts" / built.name)], check=True)
    return cache


@pytest.fixture(scope="session")
def tvm_python(tvm_cache) -> str:
    """The Python of a venv with the newest apache-tvm release the tests use (built once a session)."""
    from abwatch.builders import TvmWheelBuilder
    from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig

    config = Config(build=TvmWheelBuildConfig(), cache_dir=tvm_cache,
                    workloads=[TvmWorkloadConfig(name="x", model="builtin:mlp")])
    return str(TvmWheelBuilder(config).build("0.27.0.post1").path / "bin" / "python")


@pytest.fixture(scope="session")
def bench_repo(tmp_path_factory) -> Path:
    """A real git repository of a C benchmark with the tags in :data:`HISTORY`."""
    path = tmp_path_factory.mktemp("bench-repo")
    make_demo_repo(path, HISTORY)
    return path


@pytest.fixture
def write_config(tmp_path, bench_repo):
    """Write a config for ``bench_repo`` (with overrides) and return its path."""

    def write(name: str = "abwatch.toml", *, timeout_s: float = 30, threshold_pct: float = 5.0,
              repetitions: int = 10, run_extra: str = "", noise_aware: bool = False) -> Path:
        path = tmp_path / name
        path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(bench_repo))}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
kind = "command"
command = ["./bench", "10"]
pass_env = ["FLAKY_SLOWDOWN"]  # the "flaky" commit's slowdown, set by the tests
[run]
repetitions = {repetitions}
warmup = 1
timeout_s = {timeout_s}
seed = 7
noise_aware = {str(noise_aware).lower()}
{run_extra or "max_repetitions = 60  # room to add batches when the machine is busy"}
[stats]
threshold_pct = {threshold_pct}
""")
        return path

    return write


def _filled_config(path: Path, repo: Path, cache: Path) -> Path:
    """A small-budget config for the filled database's runs."""
    path.write_text(f"""
cache_dir = {json.dumps(str(cache))}
[repo]
url = {json.dumps(str(repo))}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "lcg-loop"
kind = "command"
command = ["./bench", "5"]
pass_env = ["FLAKY_SLOWDOWN"]
[run]
repetitions = 6
warmup = 1
timeout_s = 30
seed = 11
noise_aware = false
max_seconds = 300  # a time budget, no invocation cap: a busy machine takes longer, not a wrong turn
[stats]
threshold_pct = 5.0
""")
    return path


@contextlib.contextmanager
def across_workers(tmp_path_factory, name: str) -> Iterator[Path]:
    """This run's directory that all its pytest-xdist workers share (each worker's basetemp is a
    folder of it; without xdist, the session's basetemp), held under the exclusive lock ``name``
    while the block runs: what the first worker makes there, the others find and reuse."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield shared


FILLED = "filled.json"  # in the run's shared directory: the filled template database and its runs


def _fill(pg_admin, pg_template, bench_repo, work: Path) -> tuple[str, dict[str, int]]:
    """A database filled by real compares (see :func:`filled_pg_url`), with nothing connected to
    it (it is the template of each session's copy): its name and its runs' ids."""
    from abwatch.service.cli.main import main

    url = _create_database(pg_admin, pg_template)
    config = _filled_config(work / "abwatch.toml", bench_repo, work / "cache")
    runs = {}

    def compare(name: str, control: str, treatment: str, expect: int) -> None:
        out = work / f"{name}.json"
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = main(["compare", "--config", str(config), "--control", control,
                         "--treatment", treatment, "--json", "--db", url])
        out.write_text(buffer.getvalue())
        assert code == expect, buffer.getvalue()
        runs[name] = json.loads(buffer.getvalue())["run_id"]

    compare("same", "base", "noop", 0)
    compare("regression", "noop", "slower", 1)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["verify", str(runs["regression"]), "--json", "--db", url]) == 1, buffer.getvalue()
    runs["verify"] = json.loads(buffer.getvalue())["run_id"]
    compare("faster", "slower", "faster", 0)
    name = make_url(url).database
    with pg_admin.connect() as connection:  # CREATE DATABASE ... TEMPLATE wants it to itself
        connection.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name})
    return name, runs


@pytest.fixture(scope="session")
def filled_pg_url(pg_admin, pg_template, bench_repo, tmp_path_factory):
    """A PostgreSQL database filled by real ``abwatch compare`` runs of the C benchmark:
    base→noop (same), noop→slower (a regression, then verified), slower→faster (faster).
    Returns ``(url, {"same": run_id, "regression": run_id, "verify": run_id, "faster": run_id})``.

    The compares run once a test run (a minute or more of CPU each time, on a busy host
    several): the first pytest-xdist worker that needs them fills a template, dropped when the
    run ends (:func:`pytest_sessionfinish`), and each worker's session gets a copy of its own.
    """
    with across_workers(tmp_path_factory, "filled") as shared:
        made = shared / FILLED
        if not made.exists():
            name, runs = _fill(pg_admin, pg_template, bench_repo, tmp_path_factory.mktemp("filled"))
            made.write_text(json.dumps({"database": name, "runs": runs}))
        filled = json.loads(made.read_text())
        url = _create_database(pg_admin, filled["database"])
    yield url, filled["runs"]
    _drop_database(pg_admin, url)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run's filled template is dropped by the process that outlives the workers (the
    pytest-xdist controller, or the one process without xdist)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    made = session.config._tmp_path_factory.getbasetemp() / FILLED  # type: ignore[attr-defined]
    if made.exists():
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{json.loads(made.read_text())["database"]}" '
                                        "WITH (FORCE)"))
        finally:
            engine.dispose()


def first_device(session) -> int:
    """The id of the first device a test's runs stored."""
    from sqlalchemy import select

    from abwatch.service.store.models import Device

    return session.scalars(select(Device.id)).first()


def free_port() -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range: a port that
    bind(0) hands out is one the client side of any connection (another test worker's, to
    PostgreSQL, say) may take as its local port before the server under test binds it."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default start of the range
    pick = random.SystemRandom()
    for _ in range(500):
        port = pick.randrange(20000, max(20001, min(low, 32768)))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port between 20000 and the ephemeral range")


@contextlib.contextmanager
def live_server(url: str, work: Path, *, token: str | None = "s3cret-token", max_body_mb: float = 1.0,
                rate_limit: str = "100000/minute", extra_config: str = ""):
    """``abwatch serve`` as a real process (uvicorn on 127.0.0.1) on the database ``url``;
    yields its base URL once it answers, and stops it after. Every test's requests come from
    one address: ``rate_limit`` (per client, without the token) is high unless a test says."""
    import subprocess
    import sys
    import time

    import requests

    work.mkdir(parents=True, exist_ok=True)
    config = work / "serve.toml"
    config.write_text(f"""
[repo]
url = {json.dumps(str(work))}
[build]
kind = "command"
command = ["true"]
[[workloads]]
name = "lcg-loop"
kind = "command"
command = ["true"]
[server]
max_body_mb = {max_body_mb}
rate_limit = {json.dumps(rate_limit)}
{extra_config}
""")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ABWATCH_API_TOKEN"}
    if token is not None:
        env["ABWATCH_API_TOKEN"] = token
    log = open(work / "server.log", "w")  # noqa: SIM115 - the server writes it until the block ends
    process = subprocess.Popen(
        [sys.executable, "-m", "abwatch.service.cli.main", "serve", "--config", str(config), "--db", url,
         "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # minutes on a heavily loaded host
        while True:
            try:
                if requests.get(base + "/openapi.json", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or slow to answer (a busy host)
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"abwatch serve did not start: {(work / 'server.log').read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="session")
def filled_server(filled_pg_url, tmp_path_factory):
    """The API and dashboard served on the filled database: ``(base_url, runs, token)``."""
    url, runs = filled_pg_url
    with live_server(url, tmp_path_factory.mktemp("server")) as base:
        yield base, runs, "s3cret-token"


def wait_listening(port: int, seconds: float = 30) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    import socket
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def rpc_board(tvm_python):
    """A real TVM RPC tracker and server ('local-cpu') on 127.0.0.1, each in its own process group:
    ``(tracker "host:port", [tracker, server] processes)``."""
    import signal
    import subprocess

    tracker_port = free_port()
    server_port = next(port for port in iter(free_port, None) if abs(port - tracker_port) > 1)  # ranges of 2
    procs = [subprocess.Popen([tvm_python, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                               "--port", str(tracker_port), "--port-end", str(tracker_port + 1)],
                              start_new_session=True)]
    wait_listening(tracker_port)
    procs.append(subprocess.Popen([tvm_python, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{tracker_port}",
                                   "--key", "local-cpu", "--host", "127.0.0.1", "--port", str(server_port),
                                   "--port-end", str(server_port + 1)], start_new_session=True))
    wait_listening(server_port)
    yield f"127.0.0.1:{tracker_port}", procs
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
