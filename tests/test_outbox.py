"""The alert outbox against a receiver that answers 200 and then trickles its body one byte at
a time (a per-read timeout never fires): a watch pass ends within the delivery deadline, the
alert stays pending and a later pass delivers it; SIGTERM during such a delivery ends a real
``abwatch worker`` process at once, the alert still pending.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from abwatch.service.notify import alerts
from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.config import AlertsConfig
from abwatch.service.store.models import AlertDelivery, DeliveryStatus, Regression, utcnow


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

class Trickler(BaseHTTPRequestHandler):
    """``trickle`` mode: 200, then one byte of a 1000-byte body every 0.5 s; ``ok``: 200 at once.
    Every POST is counted by mode; ``started`` is set when a trickle begins."""

    mode = "trickle"
    posts: dict[str, int] = {}
    started = threading.Event()
    closing = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        mode = Trickler.mode
        Trickler.posts[mode] = Trickler.posts.get(mode, 0) + 1
        self.send_response(200)
        self.send_header("Content-Length", "1000" if mode == "trickle" else "2")
        self.end_headers()
        if mode == "ok":
            self.wfile.write(b"ok")
            return
        Trickler.started.set()
        for _ in range(1000):
            if Trickler.closing.is_set():
                return
            try:
                self.wfile.write(b".")
                self.wfile.flush()
            except OSError:  # the client gave up
                return
            time.sleep(0.5)

    def log_message(self, *args) -> None:
        """Quiet."""


@pytest.fixture
def trickler():
    Trickler.mode, Trickler.posts = "trickle", {}
    Trickler.started.clear()
    Trickler.closing.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/services/T0/B0/SECRETPATH"
    Trickler.closing.set()
    server.shutdown()
    server.server_close()


def _deliveries(url: str, webhook: str) -> list[AlertDelivery]:
    """The deliveries to ``webhook`` (the filled database is shared by the session's tests)."""
    engine = db.make_engine(url)
    with Session(engine) as session:
        rows = list(session.scalars(select(AlertDelivery).where(AlertDelivery.webhook == alerts.label(webhook))
                                    .order_by(AlertDelivery.id)))
    engine.dispose()
    return rows


def _record_alert(url: str, webhook: str) -> int:
    """A pending ``fixed`` alert of one stored regression, as a pass records it."""
    engine = db.make_engine(url)
    with Session(engine) as session:
        regression_id = session.scalars(select(Regression.id)).first()
        alerts.enqueue(session, [regression_id], "fixed", AlertsConfig(webhooks=[webhook]))
        session.commit()
    engine.dispose()
    return regression_id


def test_a_trickling_receiver_cannot_hold_a_pass_and_a_later_pass_delivers(trickler, write_config,
                                                                            filled_pg_url):
    url, _ = filled_pg_url
    _record_alert(url, trickler)
    config = write_config()
    config.write_text(config.read_text() + f"""
[runner]
device = "outbox-box"
[watch]
control = "previous"
[alerts]
webhooks = ["{trickler}"]
timeout_s = 5
deadline_s = 4
attempts = 3
backoff_s = 10
""")
    started = time.monotonic()
    assert main(["watch", "--config", str(config), "--once", "--db", url]) == 0
    took = time.monotonic() - started
    # one POST: the deadline cut the round before a second attempt, and the row's next round
    # (backoff_s * 2 = 20 s on) was not due at the pass's last round, however long the job took
    assert Trickler.posts == {"trickle": 1}
    (row,) = _deliveries(url, trickler)
    assert row.status == DeliveryStatus.PENDING and "deadline" in row.error
    assert "SECRETPATH" not in row.webhook and "SECRETPATH" not in row.error
    # the trickle alone would take 500 s; the pass (a baseline build included) is cut at 4 s
    assert took < 120, f"the pass took {took:.0f} s"

    Trickler.mode = "ok"
    engine = db.make_engine(url)
    with Session(engine) as session:  # its retry time comes (the wait after a failed round)
        session.execute(update(AlertDelivery).where(AlertDelivery.webhook == alerts.label(trickler))
                        .values(next_at=utcnow()))
        session.commit()
    engine.dispose()
    assert main(["watch", "--config", str(config), "--once", "--db", url]) == 0
    (row,) = _deliveries(url, trickler)
    assert row.status == DeliveryStatus.DELIVERED and row.attempts == 2 and Trickler.posts["ok"] == 1
    # delivered is final: a further pass sends nothing
    assert main(["watch", "--config", str(config), "--once", "--db", url]) == 0
    assert Trickler.posts["ok"] == 1


def test_sigterm_during_a_trickling_delivery_ends_the_worker_at_once(trickler, write_config, filled_pg_url):
    url, _ = filled_pg_url
    _record_alert(url, trickler)
    config = write_config()
    config.write_text(config.read_text() + f"""
[alerts]
webhooks = ["{trickler}"]
timeout_s = 5
deadline_s = 300
""")
    proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", str(config),
                             "--device", "outbox-box", "--db", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert Trickler.started.wait(120), "the worker never began the delivery"
        time.sleep(1.0)  # well inside the trickle
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        stopped = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    _, err = proc.communicate()  # closes its pipe
    assert proc.returncode in (0, 130), err
    # at once, against a trickle of 500 s and a deadline of 300 s: beside six busy loops and four
    # test workers a Python exiting took 9.5 s, so the bound is the trickle's, not a timing
    assert stopped < 60, f"SIGTERM took {stopped:.1f} s"
    (row,) = _deliveries(url, trickler)
    assert row.status == DeliveryStatus.PENDING  # not lost: the next round sends it


class Recorder(BaseHTTPRequestHandler):
    """Answers each POST after ``delays`` (its seconds, in arrival order) with ``codes`` (200 by
    default); ``done`` lists the bodies' ``text`` in the order their answers were given."""

    delays: list[float] = []
    codes: list[int] = []
    done: list[str] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        import json

        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        with Recorder.lock:
            delay = Recorder.delays.pop(0) if Recorder.delays else 0.0
            code = Recorder.codes.pop(0) if Recorder.codes else 200
        time.sleep(delay)
        with Recorder.lock:
            Recorder.done.append(text)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_one_destinations_deliveries_arrive_in_the_order_they_were_made(fresh_pg_url):
    """A commit's "pending" status must not land after its "success": deliveries to one
    destination are sent one after another in the order they were recorded (the first answered
    slowly, so deliveries sent at once would be answered out of order), and one that was not
    delivered holds the later ones back, this round and the next, until it is."""
    Recorder.delays, Recorder.codes, Recorder.done = [0.6], [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    config = AlertsConfig(webhooks=[url], attempts=1, backoff_s=30)
    engine = db.make_engine(fresh_pg_url)
    try:
        def record(*texts: str) -> None:
            with Session(engine) as session:
                for text in texts:
                    alerts.enqueue_device(session, "stale", {"name": "board"}, text, config)
                session.commit()

        record("first", "second", "third")
        sent = alerts.deliver_pending(engine, config)
        assert [s.ok for s in sent] == [True, True, True] and Recorder.done == ["first", "second", "third"]

        Recorder.codes, Recorder.done = [500], []  # the next one fails: the two after it wait
        record("fourth", "fifth", "sixth")
        sent = alerts.deliver_pending(engine, config)
        assert Recorder.done == ["fourth"], Recorder.done
        assert [(s.ok, s.attempts) for s in sent] == [(False, 1), (False, 0), (False, 0)], sent
        assert "held: delivery" in sent[1].error
        with Session(engine) as session:  # held ones are due before the failed one: still held
            session.execute(update(AlertDelivery).where(AlertDelivery.attempts == 0).values(next_at=utcnow()))
            session.commit()
        assert alerts.deliver_pending(engine, config) == [] and Recorder.done == ["fourth"]
        with Session(engine) as session:  # the failed one due again: it goes first, then the rest
            session.execute(update(AlertDelivery).where(AlertDelivery.status == DeliveryStatus.PENDING)
                            .values(next_at=utcnow()))
            session.commit()
        assert [s.ok for s in alerts.deliver_pending(engine, config)] == [True, True, True]
        assert Recorder.done == ["fourth", "fourth", "fifth", "sixth"]
    finally:
        engine.dispose()
        server.shutdown()
        server.server_close()
