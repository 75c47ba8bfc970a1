"""Alerts: webhooks on a local HTTP server (127.0.0.1), reached through a real verify run."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from abwatch.service.notify import alerts
from abwatch.service.read import triage
from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.config import AlertsConfig
from abwatch.service.store.models import AlertDelivery, DeliveryStatus, Regression, Run

SECRET = "webhook-secret"


class Receiver(BaseHTTPRequestHandler):
    """/ok answers 200; /flaky answers 503 twice, then 200; /gone answers 410.
    Every request is kept with whether its signature verified."""

    received: list[dict] = []
    flaky_left = 2

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        signed = alerts.verify_signature(SECRET, body, self.headers.get(alerts.SIGNATURE_HEADER, ""))
        Receiver.received.append({"path": self.path, "body": json.loads(body), "signed": signed,
                                  "event": self.headers.get("X-Abwatch-Event")})
        status = 200
        if self.path == "/flaky" and Receiver.flaky_left > 0:
            Receiver.flaky_left -= 1
            status = 503
        elif self.path == "/gone":
            status = 410
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args) -> None:
        """Quiet."""


@pytest.fixture
def receiver():
    Receiver.received, Receiver.flaky_left = [], 2
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def black_hole():
    """A port that accepts connections and never answers (a hung endpoint)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    sock.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def test_a_confirmed_regression_alerts_every_webhook(receiver, black_hole, write_config, tmp_path, monkeypatch,
                                                     capsys, sqlite_url):
    monkeypatch.setenv("ABWATCH_ALERT_SECRET", SECRET)
    refused = closed_port()
    # room for the verify to decide on a busy machine (60 pairs once left +16 % at -2.7..+39 %)
    config = write_config(repetitions=6, run_extra="max_repetitions = 120")
    config.write_text(config.read_text() + f"""
[alerts]
webhooks = ["{receiver}/ok", "{receiver}/flaky", "{black_hole}", "{refused}", "{receiver}/gone"]
timeout_s = 1.0
attempts = 3
backoff_s = 0.05
dashboard_url = "http://dash.example"
""")
    url = sqlite_url
    assert main(["compare", "--config", str(config), "--control", "noop", "--treatment", "slower",
                 "--json", "--db", url]) == 1
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert Receiver.received == []  # a suspected regression is not alerted
    started = time.monotonic()
    # --config: the run's stored config names its webhooks redacted, never by their URLs
    assert main(["verify", str(run_id), "--config", str(config), "--json", "--db", url]) == 1
    assert time.monotonic() - started < 120  # the hung endpoint cost its bounded timeouts, no more

    ok = [r for r in Receiver.received if r["path"] == "/ok"]
    assert len(ok) == 1 and ok[0]["signed"] and ok[0]["event"] == "regress"
    document = ok[0]["body"]
    assert document["event"] == "regress" and document["regression"]["workload"] == "loop"
    assert "slower" in document["text"] and "Do 20% more work" in document["text"]
    assert document["regression"]["url"].startswith("http://dash.example/regressions/")
    assert [r["path"] for r in Receiver.received].count("/flaky") == 3  # two 503s, then accepted
    assert [r["path"] for r in Receiver.received].count("/gone") == 1  # a 410 is not retried

    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        rows = {row.webhook: row for row in session.scalars(select(AlertDelivery).order_by(AlertDelivery.id))}
        assert sorted(rows) == sorted(alerts.label(w) for w in (f"{receiver}/ok", f"{receiver}/flaky",
                                                                   black_hole, refused, f"{receiver}/gone"))
        assert not any("/ok" in w or "/hook" in w for w in rows)  # stored by label, never by URL
        by = {w: rows[alerts.label(w)] for w in (f"{receiver}/ok", f"{receiver}/flaky", black_hole, refused,
                                                 f"{receiver}/gone")}
        assert (by[f"{receiver}/ok"].status, by[f"{receiver}/ok"].attempts) == (DeliveryStatus.DELIVERED, 1)
        flaky = by[f"{receiver}/flaky"]
        assert (flaky.status, flaky.attempts, flaky.status_code) == (DeliveryStatus.DELIVERED, 3, 200)
        # unreachable: still pending after its attempts, for a later round
        assert (by[black_hole].status, by[black_hole].attempts) == (DeliveryStatus.PENDING, 3)
        assert "Timeout" in by[black_hole].error
        assert (by[refused].status, by[refused].attempts) == (DeliveryStatus.PENDING, 3)
        assert "ConnectionError" in by[refused].error and "/hook" not in by[refused].error  # no URL path
        gone = by[f"{receiver}/gone"]
        assert (gone.status, gone.attempts, gone.status_code) == (DeliveryStatus.GIVEN_UP, 1, 410)
        assert len({d.payload["delivery"] for d in rows.values()}) == 1
        regression_id = flaky.regression_id
        config_json = json.dumps(session.get(Run, run_id).config)
        assert not any(webhook in config_json for webhook in by)  # the stored config names labels too

        # triaged as expected: no more alerts for it
        triage.triage(session, regression_id, "expected", who="ana", note="known trade-off")
    before = len(Receiver.received)
    sent = alerts.notify(engine, [regression_id], "fixed",
                         AlertsConfig(webhooks=[f"{receiver}/ok"], attempts=1))
    assert sent == [] and len(Receiver.received) == before
    engine.dispose()


def test_unsigned_without_a_secret_and_a_fixed_alert(receiver, filled_pg_url, monkeypatch):
    monkeypatch.delenv("ABWATCH_ALERT_SECRET", raising=False)
    url, _ = filled_pg_url
    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        regression_id = session.scalars(select(Regression.id)).first()
    sent = alerts.notify(engine, [regression_id], "fixed", AlertsConfig(webhooks=[f"{receiver}/ok"]))
    assert [(a.ok, a.status_code) for a in sent] == [(True, 200)]
    (request,) = Receiver.received
    assert not request["signed"] and request["event"] == "fixed"
    assert "is fixed" in request["body"]["text"]
    with pytest.raises(ValueError, match="alert event 'bogus'"), db.session_scope(engine) as session:
        alerts.payload(session.get(Regression, regression_id), "bogus")
    engine.dispose()


def test_dead_endpoints_cost_one_delivery_bound_not_their_sum(black_hole, filled_pg_url):
    """Six hung endpoints, two attempts of 1 s each: one after the other that is 12 s;
    side by side it is one delivery's bound (~2 s)."""
    url, _ = filled_pg_url
    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        regression_id = session.scalars(select(Regression.id)).first()
    config = AlertsConfig(webhooks=[f"{black_hole}?n={i}" for i in range(6)], timeout_s=1.0, attempts=2,
                          backoff_s=0.05)
    started = time.monotonic()
    sent = alerts.notify(engine, [regression_id], "fixed", config)
    took = time.monotonic() - started
    assert len(sent) == 6 and not any(a.ok for a in sent) and {a.attempts for a in sent} == {2}
    assert took < 8, f"dead endpoints blocked for {took:.1f}s"
    engine.dispose()


@pytest.mark.slow
def test_a_watch_alerts_the_range_then_the_bisected_culprit(receiver, tmp_path, sqlite_url):
    """Several commits in the range: the `regress` alert gives the range (culprit unknown yet),
    then bisection names the commit and a `culprit` alert says which, by whom, in how many steps;
    a later pass sends neither again."""
    from tests.test_watch import shas, step, write_watch_config
    from abwatch.service.cli.demo import make_demo_repo

    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0)
    with open(config, "a") as handle:
        handle.write(f'[alerts]\nwebhooks = ["{receiver}/ok"]\n')
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0  # the baseline
    make_demo_repo(repo, (step("n1", "README", note="n1"), step("n2", "README", note="n2"),
                          step("slow", "Do 25% more work", 1.25), step("n3", "README", 1.25, note="n3")))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1
    tags = shas(repo)
    by_event = {r["event"]: r["body"]["regression"] for r in Receiver.received}
    assert sorted(by_event) == ["culprit", "regress"] and len(Receiver.received) == 2
    assert by_event["regress"]["culprit_sha"] is None and by_event["regress"]["bad_sha"] == tags["n3"]
    culprit = by_event["culprit"]
    assert culprit["culprit_sha"] == tags["slow"] and culprit["culprit_summary"] == "Do 25% more work"
    assert culprit["culprit_author"].startswith("abwatch example") and len(culprit["steps"]) >= 1
    text = next(r["body"]["text"] for r in Receiver.received if r["event"] == "culprit")
    assert tags["slow"][:12] in text and "bisected in" in text
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    assert len(Receiver.received) == 2  # each alert once


@pytest.mark.slow
def test_a_one_commit_range_is_named_by_the_regress_alert(receiver, tmp_path, sqlite_url):
    """A range of one commit needs no bisection: the `regress` alert names that commit as the
    culprit, and no second alert follows."""
    from tests.test_watch import shas, step, write_watch_config
    from abwatch.service.cli.demo import make_demo_repo

    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0)
    with open(config, "a") as handle:
        handle.write(f'[alerts]\nwebhooks = ["{receiver}/ok"]\n')
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, (step("slow", "Do 25% more work", 1.25),))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1
    tags = shas(repo)
    assert [r["event"] for r in Receiver.received] == ["regress"]
    (alert,) = Receiver.received
    assert alert["body"]["regression"]["culprit_sha"] == tags["slow"]
    assert f"culprit {tags['slow'][:12]}" in alert["body"]["text"]
