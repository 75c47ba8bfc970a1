"""Shared fixtures: a real PostgreSQL server, SQLite files, real git histories.

PostgreSQL is the server at ``$ABWATCH_TEST_POSTGRES_URL`` (default: the local one on
127.0.0.1:5432, database ``postgres``, used only to create and drop throw-away
databases). If it cannot be reached the tests that need it fail; they are never skipped.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service import db
from service.demo import Step, make_demo_repo

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


@pytest.fixture(scope="session")
def pg_admin():
    """An AUTOCOMMIT engine on the server's maintenance database."""
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    yield engine
    engine.dispose()


def _create_database(pg_admin) -> str:
    name = f"abwatch_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with pg_admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def _drop_database(pg_admin, url: str) -> None:
    name = make_url(url).database
    with pg_admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def fresh_pg_url(pg_admin):
    """URL of a new, empty PostgreSQL database, dropped after the test."""
    url = _create_database(pg_admin)
    yield url
    _drop_database(pg_admin, url)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of a new, empty SQLite file."""
    return f"sqlite:///{tmp_path / 'abwatch.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """An empty database of each kind in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'abwatch.db'}"
    return request.getfixturevalue("fresh_pg_url")


@pytest.fixture(scope="session")
def migrated_pg_url(pg_admin):
    """One PostgreSQL database at head for the session, for rolled-back-transaction tests."""
    url = _create_database(pg_admin)
    db.upgrade(url)
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
