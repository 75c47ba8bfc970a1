"""The culprit's pull request gets a comment: a real watch over a real git history names the
commit that slowed a counted benchmark, and the outbox comments on the pull request that merged
it. GitHub cannot be reached here: the comments go to a local stand-in of its REST API
(tests/github_standin.py), which answers the issue-comment and commit-pulls endpoints as GitHub
does and records every request."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.config import AlertsConfig, GithubConfig
from abwatch.service.notify import alerts, culprit_comment
from abwatch.service.notify.channels import Destinations
from abwatch.service.store import db
from abwatch.service.store.models import AlertDelivery, DeliveryStatus, utcnow
from tests.github_standin import TOKEN, GitHub
from tests.test_watch import COUNTED, shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds and runs

REPO = "acme/tvm"
TOKEN_ENV = "ABWATCH_TEST_CULPRIT_TOKEN"


@pytest.fixture
def watched(tmp_path, monkeypatch):
    """A demo repository measured once (its baseline), watched with ``[github]`` pointed at the
    stand-in; yields (repo path, config path, stand-in)."""
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    server = GitHub(repo, REPO)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0,
                                measure=COUNTED)
    with open(config, "a") as handle:
        handle.write(f'[github]\nrepo = "{REPO}"\napi_url = "{server.url}"\ntoken_env = "{TOKEN_ENV}"\n'
                     '[alerts]\ndashboard_url = "http://dash.example"\n')
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    yield repo, config, server
    server.shutdown()
    server.server_close()


def _rows(url: str) -> list[AlertDelivery]:
    engine = db.make_engine(url)
    with Session(engine) as session:
        rows = list(session.scalars(select(AlertDelivery).where(AlertDelivery.event == culprit_comment.EVENT)
                                    .order_by(AlertDelivery.id)))
    engine.dispose()
    return rows


def test_the_squash_merged_culprit_s_pull_request_is_commented_once(watched, sqlite_url):
    repo, config, server = watched
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0  # the baseline
    assert server.comments == {}
    make_demo_repo(repo, (step("slow", "Do 25% more work (#42)", 1.25),))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1  # confirmed, culprit named
    sha = shas(repo)["slow"]
    (row,) = _rows(sqlite_url)
    assert row.webhook == f"github-culprit:{REPO}" and row.status is DeliveryStatus.DELIVERED and row.error is None
    assert row.payload["pr"] == 42 and TOKEN not in str(row.payload)  # from the summary; the token never stored
    assert server.requests_to("GET", r"/commits/.*/pulls") == []  # the summary named it: GitHub not asked
    (comment,) = server.comments.values()
    body = comment["body"]
    assert comment["issue"] == 42 and body.startswith(culprit_comment.marker(row.regression_id) + "\n")
    assert f"`{sha[:12]}` \"Do 25% more work (#42)\" of this pull request is the culprit of a +" in body
    assert "regression of `loop` (runtime, instructions) on device `bench-box`, confirmed by verify run" in body
    assert "; the only commit of its range." in body  # a one-commit range: no bisection step
    assert f"(http://dash.example/regressions/{row.regression_id})" in body

    # the same regression delivered again (a retry after a lost answer): its comment is edited
    (comment_id,) = server.comments
    server.comments[comment_id]["body"] = culprit_comment.marker(row.regression_id) + "\nstale"
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        again = session.get(AlertDelivery, row.id)
        assert again is not None
        again.status, again.next_at = DeliveryStatus.PENDING, utcnow()
        session.commit()
    github = GithubConfig(repo=REPO, api_url=server.url, token_env=TOKEN_ENV)
    (sent,) = alerts.deliver_pending(engine, Destinations(AlertsConfig(), github))
    engine.dispose()
    assert sent.ok and list(server.comments) == [comment_id]
    assert server.comments[comment_id]["body"] == body
    assert len(server.requests_to("PATCH", rf"/issues/comments/{comment_id}")) == 1
    assert len(server.requests_to("POST", r"/issues/42/comments")) == 1


def test_without_a_number_github_is_asked_which_pull_request_merged_it(watched, sqlite_url):
    repo, config, server = watched
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, (step("slow", "Do 25% more work", 1.25),))
    server.commit_pulls[shas(repo)["slow"]] = [{"number": 3, "merged_at": None},  # an open one that has it too
                                              {"number": 7, "merged_at": "2026-11-27T10:00:00Z"}]
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1
    (comment,) = server.comments.values()
    assert comment["issue"] == 7 and "\"Do 25% more work\" of this pull request is the culprit" in comment["body"]
    assert len(server.requests_to("GET", r"/commits/[0-9a-f]{40}/pulls")) == 1

    # a commit no pull request merged (pushed directly): nothing is posted, the delivery says why
    make_demo_repo(repo, (step("slower", "Do 25% more work again", 1.25 * 1.25),))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1
    assert len(server.comments) == 1
    first, second = _rows(sqlite_url)
    assert first.payload["pr"] is None and first.status is DeliveryStatus.DELIVERED and first.error is None
    assert second.payload["sha"] == shas(repo)["slower"] and second.status is DeliveryStatus.DELIVERED
    assert second.error is not None and second.error.startswith("skipped: no merged pull request has commit")
