"""Credentials in a repository URL are never stored or shown, and one repository is one row.

The repository is served over real HTTP (git's dumb protocol, from a bare clone on
127.0.0.1) and configured with a password in its URL, as people do; every command that
stores a repository (compare, the watch, its verification and bisection) must store the
same masked row, and nothing in the database or in ``abwatch status`` may hold the password.
"""

from __future__ import annotations

import functools
import json
import subprocess
import threading
from pathlib import Path
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Commit, Repository, WatchedCommit
from tests.test_watch import step, write_watch_config

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

SECRET = "s3cretPassw0rd"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output is the watch's
        pass


@pytest.fixture
def served_repo(tmp_path):
    """(working repository, URL with a password) of a bare clone served over HTTP on 127.0.0.1."""
    work = tmp_path / "work"
    make_demo_repo(work, (step("base", "Baseline"),))
    root = tmp_path / "srv"
    root.mkdir()
    bare = root / "bench.git"

    def publish() -> None:
        if not bare.exists():
            subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
        subprocess.run(["git", "push", "-q", "--tags", str(bare), "main"], cwd=work, check=True)
        subprocess.run(["git", "update-server-info"], cwd=bare, check=True)

    publish()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield work, f"http://abwatch:{SECRET}@127.0.0.1:{server.server_address[1]}/bench.git", publish
    server.shutdown()
    server.server_close()  # shutdown() stops serving; the listening socket is closed apart


def _all_text(url: str) -> str:
    """Every row of every table, as text: where a stored secret would show."""
    engine = db.make_engine(url)
    dump = []
    with engine.connect() as connection:
        for table in inspect(connection).get_table_names():
            dump += [repr(tuple(row)) for row in connection.execute(text(f'SELECT * FROM "{table}"'))]
    engine.dispose()
    return "\n".join(dump)


def test_compare_watch_verify_and_bisect_store_one_masked_repository(tmp_path, served_repo, db_url, capsys):
    work, url, publish = served_repo
    config_path = write_watch_config(tmp_path, "REPO", 'schedule = "0 2 * * *"\ntimezone = "UTC"',
                                     threshold_pct=5.0)
    path = Path(config_path)
    path.write_text(path.read_text().replace(json.dumps("REPO"), json.dumps(url)))
    assert main(["watch", "--config", config_path, "--once", "--db", db_url]) == 0  # baseline
    make_demo_repo(work, (step("n1", "README", note="n1"), step("slow", "Do 25% more work", 1.25),
                          step("n2", "README", 1.25, note="n2")))
    publish()
    # the watch finds the slowdown, verifies it and bisects it: every path that stores a repository
    assert main(["watch", "--config", config_path, "--once", "--db", db_url]) == 1
    assert main(["compare", "--config", config_path, "--control", "base", "--treatment", "n1",
                 "--db", db_url]) in (0, 1)
    capsys.readouterr()
    assert main(["status", "--json", "--db", db_url]) == 0
    status = capsys.readouterr().out
    assert SECRET not in status
    assert json.loads(status)["watched"][0]["repository"] == url.replace(SECRET, "***")

    engine = db.make_engine(db_url)
    with Session(engine) as session:
        repositories = session.scalars(select(Repository)).all()
        assert [r.url for r in repositories] == [url.replace(SECRET, "***")]
        regression_culprit = session.execute(text(
            "SELECT c.summary FROM regressions r JOIN commits c ON c.id = r.culprit_commit_id")).scalar()
        assert regression_culprit == "Do 25% more work"
    engine.dispose()
    dump = _all_text(db_url)
    assert SECRET not in dump and "abwatch:***@127.0.0.1" in dump


def test_migration_merges_a_repository_split_by_credentials(empty_db_url):
    """A database written by the old code: the watch's rows under the URL with the password,
    compare's under the masked one. After the migration: one row, the whole history under it."""
    db_url = empty_db_url
    db.upgrade(db_url, "0011")
    secret_url, masked = f"http://u:{SECRET}@host/x.git", "http://u:***@host/x.git"
    engine = db.make_engine(db_url)
    with engine.begin() as connection:
        def insert(sql: str, **values) -> int:
            return connection.execute(text(sql + " RETURNING id"), values).scalar()

        now = "2026-01-01 00:00:00"
        masked_id = insert("INSERT INTO repositories (url, created_at) VALUES (:u, :t)", u=masked, t=now)
        secret_id = insert("INSERT INTO repositories (url, created_at) VALUES (:u, :t)", u=secret_url, t=now)
        ids = {}
        for repo, sha in ((masked_id, "a" * 40), (secret_id, "a" * 40), (secret_id, "b" * 40)):
            ids[(repo, sha)] = insert("INSERT INTO commits (repository_id, sha, summary, author) "
                                      "VALUES (:r, :s, 'x', 'y')", r=repo, s=sha)
        progress = insert("INSERT INTO watch_progress (repository_id, branch, device, config_hash, updated_at) "
                          "VALUES (:r, 'main', 'box', 'h', :t)", r=secret_id, t=now)
        for sha in ("a" * 40, "b" * 40):
            insert("INSERT INTO watched_commits (progress_id, commit_id, status) VALUES (:p, :c, 'ok')",
                   p=progress, c=ids[(secret_id, sha)])
        insert("INSERT INTO jobs (kind, device, status, dedupe_key, payload, attempts, created_at) "
               "VALUES ('test', 'box', 'queued', 'k', :p, 0, :t)",
               p=json.dumps({"progress_id": progress, "sha": "b" * 40}), t=now)
    engine.dispose()

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        assert [(r.id, r.url) for r in session.scalars(select(Repository))] == [(masked_id, masked)]
        commits = {c.sha: c for c in session.scalars(select(Commit))}
        assert sorted(commits) == ["a" * 40, "b" * 40]
        assert {c.repository_id for c in commits.values()} == {masked_id}
        watched = session.scalars(select(WatchedCommit)).all()
        assert sorted(w.commit.sha for w in watched) == ["a" * 40, "b" * 40]
        assert session.execute(text("SELECT repository_id FROM watch_progress")).scalar() == masked_id
    engine.dispose()
    assert SECRET not in _all_text(db_url)
