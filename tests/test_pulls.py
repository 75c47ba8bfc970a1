"""Pull-request runs: signed GitHub webhook deliveries to a real ``abwatch serve``, a local
stand-in for GitHub's REST API (every request recorded), a real git history of the C
benchmark, real builds and runs, a real queue on PostgreSQL, and the outbox that answers."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading

import git
import pytest
import requests
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.config import AlertsConfig, load_config
from abwatch.service.notify import alerts
from abwatch.service.notify.channels import Destinations
from abwatch.service.stats.verdict import RegressionState, TriageStatus
from abwatch.service.store import db
from abwatch.service.store.models import Job, Regression, TriageEvent
from abwatch.service.watch import daemon, pulls, queue
from abwatch.service.web.pull_commands import parse_command
from tests.github_standin import TOKEN, GitHub, comment_event, deliver
from tests.test_try import serving
from tests.test_watch import write_watch_config

SECRET = "hook-secret-\u00e9"
REPO = "acme/tvm"


@pytest.fixture
def github(bench_repo):
    server = GitHub(bench_repo, REPO)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def pr_config(tmp_path, bench_repo, github: GitHub, rate_limit: str = "100/minute", extra: str = "") -> str:
    path = write_watch_config(tmp_path, bench_repo, "", threshold_pct=5.0)
    with open(path, "a") as handle:
        handle.write(f'''[github]
repo = "{REPO}"
api_url = "{github.url}"
token_env = "ABWATCH_TEST_GH_TOKEN"
webhook_secret_env = "ABWATCH_TEST_HOOK_SECRET"
allow = ["release-bot"]
{extra}
[alerts]
dashboard_url = "http://dash.example"
[server]
rate_limit = "{rate_limit}"
''')
    return path


def work_and_deliver(url: str, config_path: str) -> None:
    """What a worker of the device does: its jobs, then a round of the outbox."""
    config = load_config(config_path)
    engine = db.make_engine(url)
    worker = queue.Worker(engine, "bench-box", daemon.handlers(config))
    try:
        while worker.run_one() is not None:
            pass
        deliver_round(engine, config)
    finally:
        worker.close()
        engine.dispose()


def deliver_round(engine, config) -> None:
    sent = alerts.deliver_pending(engine, Destinations(config.alerts, config.github))
    assert sent and all(s.ok for s in sent), sent


def job_count(url: str) -> int:
    engine = db.make_engine(url)
    with Session(engine) as session:
        count = session.scalar(select(func.count()).select_from(Job))
    engine.dispose()
    return count or 0


def test_a_comment_command_is_answered_in_the_pull_request(tmp_path, bench_repo, fresh_pg_url, github, monkeypatch):
    tags = {t.name: t.commit.hexsha for t in git.Repo(bench_repo).tags}
    github.permissions.update({"alice": "write", "mallory": "read"})
    github.pulls[42] = {"head": tags["slower"], "base": tags["noop"]}
    config_path = pr_config(tmp_path, bench_repo, github)
    monkeypatch.setenv("ABWATCH_TEST_GH_TOKEN", TOKEN)
    monkeypatch.setenv("ABWATCH_TEST_HOOK_SECRET", SECRET)
    db.upgrade(fresh_pg_url)
    command = comment_event(REPO, 42, "alice", "Looks slow to me.\n@abwatch try loop --verify\nthanks")
    with (tmp_path / "serve.log").open("w") as log, serving(config_path, fresh_pg_url, log) as base:
        # refused, each without a job and without a 5xx
        assert deliver(base, None, "issue_comment", command).status_code == 401  # unsigned
        assert deliver(base, "not-the-secret", "issue_comment", command).status_code == 401
        forged = dict(command, comment={**command["comment"], "body": "@abwatch try"})
        signed = json.dumps(command).encode()
        assert deliver(base, None, "issue_comment", json.dumps(forged).encode(),
                       signature=signature(SECRET, signed)).status_code == 401  # another body's signature
        assert deliver(base, SECRET, "issue_comment", b"{not json").status_code == 400
        assert deliver(base, SECRET, "issue_comment", {**command, "issue": {"pull_request": {}}}).status_code == 422
        unknown = deliver(base, SECRET, "issue_comment", comment_event(REPO, 42, "stranger", "@abwatch try"))
        assert unknown.status_code == 403 and "stranger" in unknown.text
        reader = deliver(base, SECRET, "issue_comment", comment_event(REPO, 42, "mallory", "@abwatch try"))
        assert reader.status_code == 403
        assert deliver(base, SECRET, "issue_comment", comment_event(REPO, 42, "alice", "@abwatch try nosuch")
                       ).status_code == 422
        assert deliver(base, SECRET, "issue_comment", comment_event(REPO, 42, "alice", "@abwatch fly")).status_code == 422
        assert deliver(base, SECRET, "issue_comment", comment_event(REPO, 42, "alice", "just words")).status_code == 202
        assert deliver(base, SECRET, "ping", {"zen": "Keep it simple.", "repository": {"full_name": REPO}}
                       ).status_code == 200
        assert job_count(fresh_pg_url) == 0
        assert not github.requests_to("POST", r"/issues/42/comments")
        # the command: one job per device, the head against its merge base
        queued = deliver(base, SECRET, "issue_comment", command, delivery="delivery-1")
        assert queued.status_code == 202, queued.text
        assert queued.json()["control"] == tags["noop"] and queued.json()["treatment"] == tags["slower"]
        again = deliver(base, SECRET, "issue_comment", command, delivery="delivery-1")  # GitHub's redelivery
        assert again.status_code == 200 and again.json()["jobs"] == []
        assert job_count(fresh_pg_url) == 1
        assert github.requests_to("GET", r"/collaborators/alice/permission")
        config = load_config(config_path)
        engine = db.make_engine(fresh_pg_url)
        deliver_round(engine, config)  # queued: the comment is created, the check run is in progress
        (comment_id,) = github.comments
        assert "Queued" in github.comments[comment_id]["body"]
        (check,) = github.checks.values()
        assert check["status"] == "in_progress" and check["head_sha"] == tags["slower"] and check["name"] == "abwatch"

        work_and_deliver(fresh_pg_url, config_path)  # measured and verified: a regression
        assert list(github.comments) == [comment_id]  # edited, not a second comment
        assert len(github.requests_to("POST", r"/issues/42/comments")) == 1
        # edited as the job built and measured (tests/test_pulls.py::test_the_comment_is_edited_as_the_job_goes)
        # and when it ended: the one comment each time
        assert len(github.requests_to("PATCH", rf"/issues/comments/{comment_id}")) >= 1
        assert len(github.requests_to("PATCH", r"/issues/comments/\d+")) == len(
            github.requests_to("PATCH", rf"/issues/comments/{comment_id}"))
        body = github.comments[comment_id]["body"]
        assert body.startswith(pulls.pull_answer.MARKER) and "#### bench-box" in body
        row = next(line for line in body.splitlines() if line.startswith("| loop |"))
        assert "**regression (confirmed)**" in row and "http://dash.example/runs/" in row and "ms |" in row
        # under the table, what explains it: a command timed on wall time has no profile, and says so
        assert "**loop**, runtime regression on time:" in body and "No profile: no per-operator table" in body
        (check,) = github.checks.values()
        assert check["status"] == "completed" and check["conclusion"] == "failure"
        assert "loop" in check["output"]["title"] and "| loop |" in check["output"]["summary"]
        assert github.labels[42] == {"perf-regression"}

        # a triage comment records the decision (fixed, by the commit it names) and takes the label off
        triaged = deliver(base, SECRET, "issue_comment",
                          comment_event(REPO, 42, "alice", "@abwatch triage fixed-by ABC1234"))
        assert triaged.status_code == 200, triaged.text
        assert (triaged.json()["as"], triaged.json()["fixed_by"]) == ("fixed", "abc1234")
        deliver_round(engine, config)
        assert github.labels[42] == set() and list(github.comments) == [comment_id]
        assert github.requests_to("DELETE", r"/issues/42/labels/perf-regression")
        (check,) = github.checks.values()
        assert check["conclusion"] == "neutral"
        row = next(line for line in github.comments[comment_id]["body"].splitlines() if line.startswith("| loop |"))
        assert "triaged fixed by abc1234" in row
        with Session(engine) as session:
            (event,) = session.scalars(select(TriageEvent)).all()
            assert (event.status, event.fixed_by) == (TriageStatus.FIXED, "abc1234")
            assert event.who == "github:alice" and event.note == "fixed by abc1234"
            assert event.issue_url == f"https://github.com/{REPO}/commit/abc1234"
            (regression,) = session.scalars(select(Regression)).all()
            assert (regression.state, regression.triage) == (RegressionState.REGRESS, TriageStatus.FIXED)
            regression_id = regression.id
            # fixed: no live problem, so no more alerts for it
            assert alerts.enqueue(session, [regression_id], "regress",
                                  AlertsConfig(webhooks=["http://127.0.0.1:9/hook"])) == 0
        engine.dispose()
        # the weekly report lists it as fixed, naming the fixing commit; nothing waits for a person
        report = requests.get(f"{base}/api/report", params={"since": "7d"}, timeout=30).json()
        assert report["counts"]["fixed"] == 1 and report["counts"]["untriaged"] == 0
        (fixed,) = report["devices"][0]["fixed"]
        assert (fixed["id"], fixed["triage"], fixed["fixed_by"]) == (regression_id, "fixed", "abc1234")
        markdown = requests.get(f"{base}/api/report", params={"since": "7d", "format": "markdown"}, timeout=30).text
        fixed_list = markdown[markdown.index("**Fixed**"):]
        assert f"| [{regression_id}](" in fixed_list and "| regress | fixed by abc1234 |" in fixed_list
    for call in github.calls:  # the token went only where it belongs, never into a body
        assert TOKEN not in json.dumps(call["body"])
    assert SECRET not in (tmp_path / "serve.log").read_text()


def test_parse_command_takes_words_never_a_shell():
    assert parse_command("@abwatch try a b --verify", "@abwatch") == pulls.Command("try", ("a", "b"), True)
    assert parse_command("no command here", "@abwatch") is None
    triage = parse_command("@ABWATCH triage not-a-bug", "@abwatch")
    assert triage is not None and triage.triage and triage.triage.value == "invalid"
    fixed = parse_command("@abwatch triage fixed-by 0123abcd", "@abwatch")
    assert fixed is not None and fixed.fixed_by == "0123abcd" and fixed.triage is TriageStatus.FIXED
    for bad in ("@abwatch try --rm", "@abwatch triage fixed-by $(reboot)", "@abwatch triage maybe", "@abwatch"):
        with pytest.raises(pulls.CommandError):
            parse_command(bad, "@abwatch")
    assert not pulls.verify_signature("s", b"body", None)
    assert pulls.verify_signature("s", b"body", signature("s", b"body"))


def signature(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256`` of ``body``, as GitHub computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_automatic_runs_and_the_servers_limits(tmp_path, bench_repo, fresh_pg_url, github, monkeypatch):
    tags = {t.name: t.commit.hexsha for t in git.Repo(bench_repo).tags}
    config_path = pr_config(tmp_path, bench_repo, github, rate_limit="8/minute", extra='pr_runs = "auto"')
    with open(config_path, "a") as handle:
        handle.write("max_body_mb = 0.01\n")
    monkeypatch.setenv("ABWATCH_TEST_GH_TOKEN", TOKEN)
    monkeypatch.setenv("ABWATCH_TEST_HOOK_SECRET", SECRET)
    db.upgrade(fresh_pg_url)
    opened = {"action": "opened", "number": 7, "repository": {"full_name": REPO},
              "sender": {"login": "release-bot", "type": "User"},  # on [github] allow: no API question
              "pull_request": {"head": {"sha": tags["slower"]}, "base": {"sha": tags["noop"]}}}
    with (tmp_path / "serve.log").open("w") as log, serving(config_path, fresh_pg_url, log) as base:
        first = deliver(base, SECRET, "pull_request", opened)
        assert first.status_code == 202, first.text
        pushed = deliver(base, SECRET, "pull_request", {**opened, "action": "synchronize"})  # the same head
        assert pushed.status_code == 200 and pushed.json()["jobs"] == []
        assert deliver(base, SECRET, "pull_request", {**opened, "action": "closed"}).status_code == 202
        assert not github.requests_to("GET", r"/collaborators/.*")
        big = deliver(base, SECRET, "issue_comment", b"x" * 20_000)
        assert big.status_code == 413
        answers = [deliver(base, "wrong", "issue_comment", b"{}").status_code for _ in range(10)]
        assert 429 in answers and set(answers) <= {401, 429}
    assert job_count(fresh_pg_url) == 1


def test_the_comment_written_at_acceptance_says_what_will_run(session):
    from abwatch.service.config import GithubConfig
    from abwatch.service.notify import pull_answer

    github = GithubConfig(repo="apache/tvm")
    payload = {"control": "a" * 40, "treatment": "b" * 40, "workloads": ["mlp", "cnn"], "verify": True,
               "pr": 7, "repo": "apache/tvm"}
    queue.enqueue(session, pulls.KIND, "ci-box", payload, f"{pull_answer.job_key(github, 7)}comment-1:ci-box")
    shown = pull_answer.render(session, github, 7)
    assert f"### abwatch: {'b' * 12} against its merge base {'a' * 12}" in shown["comment"]
    assert ("Queued (job " in shown["comment"] and "): `mlp`, `cnn`; a suspected regression is verified. This "
            "comment is edited with the verdicts when the job ends." in shown["comment"])
    assert shown["check"]["status"] == "in_progress" and shown["check"]["title"] == "measuring on 1 device(s)"


def test_the_comment_is_edited_as_the_job_goes(tmp_path, bench_repo, fresh_pg_url, github, monkeypatch):
    """The comment written at acceptance is edited in place while the ``pr`` job runs: after each
    side's build, when measuring starts, as the workload is measured, then with the verdict."""
    from abwatch.service.notify import pull_answer

    tags = {t.name: t.commit.hexsha for t in git.Repo(bench_repo).tags}
    config_path = pr_config(tmp_path, bench_repo, github)
    monkeypatch.setenv("ABWATCH_TEST_GH_TOKEN", TOKEN)
    db.upgrade(fresh_pg_url)
    config = load_config(config_path)
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        (job,) = pulls.submit(session, config, 42, tags["slower"], tags["noop"], pulls.Command("try", ("loop",)),
                              "alice", pulls.comment_key(1))
    deliver_round(engine, config)  # accepted: the comment is written
    (comment_id,) = github.comments
    assert "Queued (job " in github.comments[comment_id]["body"]

    work_and_deliver(fresh_pg_url, config_path)
    assert list(github.comments) == [comment_id]  # one comment, edited in place
    assert len(github.requests_to("POST", r"/issues/42/comments")) == 1
    bodies = [c["body"]["body"] for c in github.requests_to("PATCH", rf"/issues/comments/{comment_id}")]
    assert len(github.requests_to("PATCH", r"/issues/comments/\d+")) == len(bodies)

    def first(text: str) -> int:
        return next(i for i, body in enumerate(bodies) if text in body)

    control, treatment = f"- control {tags['noop'][:12]}: built in ", f"- treatment {tags['slower'][:12]}: built in "
    order = [first(control), first(treatment), first("- measuring 1 workload(s)"),
             first("- 1 of 1 workload(s) measured: loop "), first("| loop |")]
    assert order == sorted(order) and len(set(order)) == len(order), order
    running = bodies[order[3]]
    assert running.startswith(pull_answer.MARKER) and "Running (job " in running and "| loop |" not in running
    assert control in running and treatment in running  # what was done so far stays
    final = bodies[-1]
    assert "| loop |" in final and "Running (job" not in final and "measured: loop" not in final
    assert github.comments[comment_id]["body"] == final
    (check,) = github.checks.values()
    assert check["status"] == "completed"
    with Session(engine) as session:  # each edit its own delivered row; none left waiting
        rows = session.scalars(select(pull_answer.AlertDelivery).order_by(pull_answer.AlertDelivery.id)).all()
        assert rows and all(r.status.value == "delivered" for r in rows), [(r.id, r.status, r.error) for r in rows]
    engine.dispose()


def test_a_state_not_yet_sent_is_replaced_and_edits_are_coalesced(fresh_pg_url, monkeypatch):
    """A running job's progress: each stage sent, workloads within a stage at most once per
    ``every_s``; a row waiting for its first attempt takes the newer state in place."""
    from types import SimpleNamespace

    from abwatch.service.compare.driver import NullProgress
    from abwatch.service.compare.progress import BUILT, MEASURED, MEASURING, Stage
    from abwatch.service.config import GithubConfig
    from abwatch.service.notify import pull_answer
    from abwatch.service.store.models import AlertDelivery, DeliveryStatus

    monkeypatch.delenv("ABWATCH_NO_SUCH_TOKEN", raising=False)
    github = GithubConfig(repo="apache/tvm", token_env="ABWATCH_NO_SUCH_TOKEN")  # no token: nothing is sent
    payload = {"control": "a" * 40, "treatment": "b" * 40, "workloads": [], "verify": False, "pr": 7,
               "repo": "apache/tvm"}
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    session = Session(engine, expire_on_commit=False)
    job = queue.enqueue(session, pulls.KIND, "ci-box", payload, f"{pull_answer.job_key(github, 7)}comment-1:ci-box")
    session.commit()
    config = SimpleNamespace(github=github, alerts=AlertsConfig())
    now = [100.0]
    told = pulls.PullProgress(engine, config, job, NullProgress(), every_s=20, clock=lambda: now[0])  # type: ignore[arg-type]
    sent = []
    told.send = lambda: sent.append(list(told.steps)) or pulls.PullProgress.send(told)  # type: ignore[method-assign]
    told.stage(Stage(BUILT, "built in 12 s", side="control", sha="a" * 40))
    told.stage(Stage(BUILT, "cached", side="treatment", sha="b" * 40))
    told.stage(Stage(MEASURING, total=3))
    told.stage(Stage(MEASURED, "no_change +0.10%", workload="mlp", done=1, total=3))
    now[0] += 5
    told.stage(Stage(MEASURED, "regression +9.00%", workload="cnn", done=2, total=3))  # within 20 s: waits
    assert len(sent) == 4
    told.stage(Stage(MEASURED, "no_change -0.20%", workload="rnn", done=3, total=3))  # the last: sent
    assert len(sent) == 5 and sent[-1][-1].startswith(
        "3 of 3 workload(s) measured: mlp no_change +0.10%, cnn regression +9.00%, rnn no_change -0.20%")
    rows = session.scalars(select(AlertDelivery).where(AlertDelivery.event == pull_answer.EVENT)).all()
    (row,) = [r for r in rows if r.status == DeliveryStatus.PENDING]  # one row, its state replaced
    session.refresh(row)
    assert "- 3 of 3 workload(s) measured: mlp" in row.payload["comment"]
    assert "- control aaaaaaaaaaaa: built in 12 s" in row.payload["comment"]
    assert "- treatment bbbbbbbbbbbb: cached" in row.payload["comment"]
    session.close()
    engine.dispose()
