"""GitHub commit statuses, sent to a local server that speaks GitHub's statuses endpoint
(``POST /repos/{owner}/{repo}/statuses/{sha}``), by a real watch over a real git history:
``pending`` when a commit is queued, then ``success``, ``failure`` (a confirmed regression,
and the culprit bisection names) or ``error`` (a failed build), through the alert outbox."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.store import db
from abwatch.service.store.models import AlertDelivery, DeliveryStatus
from tests.test_watch import shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds and runs

STATUSES = re.compile(r"^/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/statuses/(?P<sha>[0-9a-f]{40})$")


class FakeGitHub(ThreadingHTTPServer):
    """Answers the statuses endpoint as GitHub does (201 with the status), records each call."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                match = STATUSES.match(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if match is None:
                    self.send_response(404)
                elif self.headers.get("Authorization") != "Bearer gh-test-token":
                    self.send_response(401)
                elif body.get("state") not in ("pending", "success", "failure", "error"):
                    self.send_response(422)
                else:
                    server.calls.append({**match.groupdict(), **body})
                    self.send_response(201)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def fake_github():
    server = FakeGitHub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_watch_sets_commit_statuses_through_the_outbox(tmp_path, fresh_pg_url, fake_github, monkeypatch):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"), step("noop", "Reword the README", note="words"),
                          step("slow", "Do 15% more work", 1.15), step("broken", "Break the build", 1.15, broken=True)))
    tags = shas(repo)
    config = write_watch_config(tmp_path, repo, 'start = "base"', threshold_pct=5.0)
    port = fake_github.server_address[1]
    with open(config, "a") as handle:
        handle.write(f'''[github]
repo = "acme/tvm"
api_url = "http://127.0.0.1:{port}"
token_env = "ABWATCH_TEST_GH_TOKEN"
[alerts]
dashboard_url = "http://dash.example"
''')
    monkeypatch.setenv("ABWATCH_TEST_GH_TOKEN", "gh-test-token")
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1  # the regression confirmed
    by_sha: dict[str, list[str]] = {}
    for call in fake_github.calls:
        assert (call["owner"], call["repo"], call["context"]) == ("acme", "tvm", "abwatch/bench-box")
        by_sha.setdefault(call["sha"], []).append(call["state"])
    assert by_sha[tags["base"]] == ["pending", "success"]
    assert by_sha[tags["noop"]] == ["pending", "success"]
    # confirmed, then named as the culprit by bisection (a one-commit range)
    assert by_sha[tags["slow"]] == ["pending", "failure", "failure"]
    assert by_sha[tags["broken"]] == ["pending", "error"]
    slow = [c for c in fake_github.calls if c["sha"] == tags["slow"] and c["state"] == "failure"]
    assert all(c["target_url"].startswith("http://dash.example/runs/") for c in slow)
    assert any("culprit of" in c["description"] for c in slow)
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:  # recorded like every alert: delivered, the token nowhere
        rows = session.scalars(select(AlertDelivery).where(AlertDelivery.event == "status")).all()
        assert len(rows) == 9 and {r.status for r in rows} == {DeliveryStatus.DELIVERED}
        assert all(r.webhook == "github:acme/tvm" and "gh-test-token" not in json.dumps(r.payload) for r in rows)
    engine.dispose()


def test_statuses_wait_while_the_token_is_missing(tmp_path, fresh_pg_url, fake_github, monkeypatch):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, "", threshold_pct=5.0)
    with open(config, "a") as handle:
        handle.write(f'[github]\nrepo = "acme/tvm"\napi_url = "http://127.0.0.1:{fake_github.server_address[1]}"\n'
                     'token_env = "ABWATCH_TEST_GH_TOKEN"\n')
    monkeypatch.delenv("ABWATCH_TEST_GH_TOKEN", raising=False)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    assert fake_github.calls == []
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        rows = session.scalars(select(AlertDelivery)).all()
        assert [r.status for r in rows] == [DeliveryStatus.PENDING] * 2  # pending, success: kept to send later
        assert "variable is unset" in rows[0].error
    engine.dispose()
