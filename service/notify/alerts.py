"""Alerts: a webhook POST to each configured webhook when a regression is confirmed or fixed, or a device goes silent.

Payload (JSON, ``Content-Type: application/json``)::

    {"event": "regress" | "culprit" | "fixed",  (a confirmed improvement, "direction": "faster",
                                               is told only by its "culprit": the commit that made it faster)
     "text": "<a line a person reads (Slack's incoming webhooks show it as the message), then a
              few lines of what explains it: the functions that grew, or the operators>",
     "regression": {"id", "workload", "device", "kind", "direction", "state", "change_pct", "good_sha",
                    "bad_sha", "culprit_sha", "culprit_summary", "culprit_author", "steps",
                    "run_id", "url", "explanation"},
     "sent_at": "<ISO 8601 time>", "delivery": "<uuid, the same for every attempt>"}

A device whose worker has been silent for longer than ``watch.stale_after`` (a data stoppage)
is alerted once, and again when it is heard from (:func:`enqueue_device`)::

    {"event": "stale" | "recovered", "text": "...", "device": {"name", "host", "pid",
     "heartbeat_at", "stopped_at", "silent_s", "fingerprint", "fingerprint_summary", "queued"},
     "sent_at", "delivery"}

Headers: ``X-Abwatch-Event``, ``X-Abwatch-Delivery`` and, when the environment variable
named by ``alerts.secret_env`` holds a secret, ``X-Abwatch-Signature-256: sha256=<hex>``,
the HMAC-SHA256 of the exact body bytes with that secret (GitHub's scheme; receivers
compare it in constant time).

**An outbox.** A delivery is an ``alert_deliveries`` row, written ``pending`` in the same
transaction as the state change it tells of (:func:`enqueue`), before anything is sent; an
alert is never lost to a crash, a hung receiver or a signal. :func:`deliver_pending` sends the
pending rows whose time has come, side by side, each retried ``alerts.attempts`` times with
doubling waits (a connection error, a timeout, a 429 or a 5xx), the whole round cut at
``alerts.deadline_s`` (a receiver that answers 200 and then sends one byte every few seconds
defeats a per-read timeout, not this); a delivery that did not get through stays ``pending``
for a later round (the watch's next pass, a worker's next job) until ``alerts.retry_for_s``
has passed, when it is ``given_up``; a 4xx other than 429 gives up at once. Sending runs in
daemon threads that nothing waits for past the deadline or a stop request, so SIGTERM ends
the process at once and the delivery stays pending.

**Webhooks are secrets** (a Slack URL's path is its token): a webhook is stored and shown by
its label (:func:`label`): ``env:NAME`` for a URL read from the environment variable NAME at
send time, else the URL redacted to its host and a short hash. A round finds each row's URL by
its label in the config of the process that sends it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
import uuid
from datetime import timedelta, UTC
from collections.abc import Collection, Iterable

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, object_session, sessionmaker

from abwatch.core.redact import redact_endpoint
from abwatch.core.plugins import Registry
from abwatch.service.config import AlertsConfig
from abwatch.service.notify import culprit_comment, explained, github, pull_answer
from abwatch.service.notify.channels import AlertChannel, Destinations, Sender, Sent
from abwatch.service.store import explain
from abwatch.service.store.models import AlertDelivery, BisectionStep, DeliveryStatus, Regression, utcnow
from abwatch.service.stats.verdict import SILENCED_TRIAGE, Direction, RegressionKind

SIGNATURE_HEADER = "X-Abwatch-Signature-256"
EVENTS = ("regress", "culprit", "fixed")
DEVICE_EVENTS = ("stale", "recovered")  # a device's worker silent past watch.stale_after; heard again
ROUND_ROWS = 200  # deliveries one round takes at most; the rest wait for the next


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does: recompute and compare in constant time."""
    return hmac.compare_digest(sign(secret, body), header or "")


def headline(regression: Regression, event: str, device: str, steps: int) -> str:
    """The alert's sentence for ``regression`` reaching ``event``: what changed, where, and the
    commit that did it (or fixed it) once known."""
    bad, good = regression.treatment_commit, regression.control_commit
    kind = RegressionKind(regression.kind).value
    culprit = regression.culprit_commit  # None until bisection names it
    sub = regression.culprit_submodule_commit  # bisected on into the culprit's submodule bump
    into = f" -> {regression.culprit_submodule_path} {sub.sha[:12]} \"{sub.summary}\"" if sub else ""
    faster = regression.direction is Direction.FASTER  # a confirmed improvement, bisected to its cause
    if faster and event == "culprit":
        assert culprit is not None, "a culprit alert is recorded once bisection named it"
        return (f"abwatch: {regression.workload.name} on {device} is {-regression.change_pct:.2f}% faster "
                f"({kind}) since {culprit.sha[:12]} \"{culprit.summary}\"{into} by {culprit.author}: the commit "
                f"that made it faster (improvement #{regression.id}, bisected in {steps} step(s))")
    if faster:
        return (f"abwatch: {regression.workload.name} on {device} is {-regression.change_pct:.2f}% faster "
                f"({kind}) in {good.sha[:12]}..{bad.sha[:12]} (improvement #{regression.id}, {event})")
    if event == "regress":
        return (f"abwatch: {regression.workload.name} on {device} is {regression.change_pct:+.2f}% slower "
                f"({kind}) in {good.sha[:12]}..{bad.sha[:12]} \"{bad.summary}\" (regression #{regression.id}, "
                + (f"confirmed; culprit {culprit.sha[:12]} \"{culprit.summary}\"{into})" if culprit
                   else "confirmed; culprit not named yet)"))
    if event == "culprit":
        assert culprit is not None, "a culprit alert is recorded once bisection named it"
        return (f"abwatch: {regression.workload.name} on {device} is {regression.change_pct:+.2f}% slower "
                f"({kind}) since {culprit.sha[:12]} \"{culprit.summary}\"{into} by {culprit.author} "
                f"(regression #{regression.id}, bisected in {steps} step(s))")
    return (f"abwatch: {regression.workload.name} on {device} is fixed: regression #{regression.id} "
            f"({regression.change_pct:+.2f}% at {bad.sha[:12]}) no longer reproduces"
            + (f"; fixed by {fixing.sha[:12]} \"{fixing.summary}\"" if (fixing := regression.fixed_by_commit) else ""))


def payload(regression: Regression, event: str, dashboard_url: str | None = None) -> dict:
    """The JSON document sent for ``regression`` reaching state ``event``."""
    if event not in EVENTS:
        raise ValueError(f"alert event {event!r}: expected one of {EVENTS}")
    bad, good = regression.treatment_commit, regression.control_commit
    device = regression.device.name if regression.device else "?"
    url = f"{dashboard_url.rstrip('/')}/regressions/{regression.id}" if dashboard_url else None
    kind = RegressionKind(regression.kind).value
    culprit = regression.culprit_commit  # None until bisection names it
    session = object_session(regression)
    steps = [] if session is None else [step.to_dict() for step in session.scalars(
        select(BisectionStep).where(BisectionStep.regression_id == regression.id).order_by(BisectionStep.position))]
    text = headline(regression, event, device, len(steps))
    # a verdict taken under heavy contention says how it was judged (service.stats.contention)
    caveat = next((v.get("caveat") for v in (regression.verify_verdict, regression.benchmark_verdict)
                   if v and v.get("caveat")), None)
    if caveat:
        text += f" [{caveat}]"
    if url:
        text += f" <{url}>"
    # what explains it (the functions that grew, or the operators), stored with the opening comparison
    explanation = explain.of_regression(session, regression) if session is not None else None
    if explanation is not None and event != "fixed":
        text += "\n" + "\n".join(explained.text_lines(explanation))
    return {
        "event": event, "text": text,
        "regression": {
            **regression.to_dict(),  # the shape the CLI, the API and the pages show
            "id": regression.id, "workload": regression.workload.name, "device": device, "kind": kind,
            "direction": Direction(regression.direction or Direction.SLOWER).value,
            "state": regression.state.value, "change_pct": regression.change_pct,
            "good_sha": good.sha, "bad_sha": bad.sha, "culprit_sha": culprit.sha if culprit else None,
            "culprit_summary": culprit.summary if culprit else None,
            "culprit_author": culprit.author if culprit else None, "steps": steps,
            "run_id": regression.run_id, "url": url, "caveat": caveat, "explanation": explanation,
        },
        "sent_at": utcnow().isoformat(), "delivery": str(uuid.uuid4()),
    }


def label(webhook: str) -> str:
    """How ``webhook`` (a config entry) is stored and shown: ``env:NAME`` as it is, a URL
    redacted (:func:`~abwatch.core.redact.redact_endpoint`); a label stays itself."""
    if webhook.startswith("env:") or "/\u2026#" in webhook:
        return webhook
    return redact_endpoint(webhook)


def _url(webhook: str) -> str | None:
    """The URL a config entry names now (``env:NAME``: the variable's value), None if unset."""
    if webhook.startswith("env:"):
        return os.environ.get(webhook.removeprefix("env:")) or None
    return None if "/\u2026#" in webhook else webhook


def enqueue(session: Session, regression_ids: Iterable[int], event: str, config: AlertsConfig) -> int:
    """Record a ``pending`` delivery of ``event`` for each regression and webhook, in the
    caller's transaction (committed with the state change it tells of). A delivery already
    recorded (the same regression, event and webhook) is not recorded again: a job taken up
    again after a crash alerts once. Regressions triaged as expected, invalid or fixed are not
    alerted. Returns how many were recorded."""
    if event not in EVENTS:
        raise ValueError(f"alert event {event!r}: expected one of {EVENTS}")
    added = 0
    for regression in (session.get(Regression, i) for i in regression_ids):
        if regression is None or regression.triage in SILENCED_TRIAGE:
            continue
        document = payload(regression, event, config.dashboard_url)
        for webhook in dict.fromkeys(label(w) for w in config.webhooks):
            if session.scalar(select(AlertDelivery.id).where(
                    AlertDelivery.regression_id == regression.id, AlertDelivery.event == event,
                    AlertDelivery.webhook == webhook)) is not None:
                continue
            now = utcnow()
            session.add(AlertDelivery(regression_id=regression.id, event=event, webhook=webhook,
                                      status=DeliveryStatus.PENDING, attempts=0, payload=document,
                                      at=now, next_at=now))
            added += 1
    session.flush()
    return added


def enqueue_device(session: Session, event: str, device: dict, text: str, config: AlertsConfig) -> int:
    """Record a ``pending`` delivery of a device's ``event`` (:data:`DEVICE_EVENTS`: its worker
    went silent, or is back) for each webhook, in the caller's transaction; the caller's
    conditional update of the device's state makes it once per episode. The document is
    ``{"event", "text", "device": {...}, "sent_at", "delivery"}``. Returns how many were recorded."""
    if event not in DEVICE_EVENTS:
        raise ValueError(f"device alert event {event!r}: expected one of {DEVICE_EVENTS}")
    text += f" <{config.dashboard_url.rstrip('/')}/devices>" if config.dashboard_url else ""
    document = {"event": event, "text": text, "device": device, "sent_at": utcnow().isoformat(),
                "delivery": str(uuid.uuid4())}
    webhooks = list(dict.fromkeys(label(w) for w in config.webhooks))
    now = utcnow()
    for webhook in webhooks:
        session.add(AlertDelivery(regression_id=None, event=event, webhook=webhook, status=DeliveryStatus.PENDING,
                                  attempts=0, payload=document, at=now, next_at=now))
    session.flush()
    return len(webhooks)


def refresh_pending(session: Session, regression_ids: Iterable[int], event: str, config: AlertsConfig) -> set[int]:
    """Write the document of ``event``'s deliveries that are still pending again, from the
    regressions as they are now (a culprit named since). The ids of the regressions rewritten."""
    rewritten: set[int] = set()
    for row in session.scalars(select(AlertDelivery).where(
            AlertDelivery.regression_id.in_(list(regression_ids)), AlertDelivery.event == event,
            AlertDelivery.status == DeliveryStatus.PENDING)):
        regression = session.get(Regression, row.regression_id)
        if regression is not None:
            row.payload = {**payload(regression, event, config.dashboard_url), "delivery": row.payload["delivery"]}
            rewritten.add(regression.id)
    session.flush()
    return rewritten


def _webhook_request(document: dict, config: AlertsConfig) -> tuple[bytes, dict[str, str]]:
    """A webhook's body (the alert document) and headers, signed when the secret is set."""
    body = json.dumps(document, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "abwatch-alerts",
               "X-Abwatch-Event": document["event"], "X-Abwatch-Delivery": document["delivery"]}
    secret = os.environ.get(config.secret_env)
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    return body, headers


class WebhookChannel(AlertChannel):
    """``[alerts] webhooks``: the alert document POSTed to a URL (or the URL an ``env:`` names)."""

    prefix = ""

    def sender(self, row: AlertDelivery, destinations: Destinations, deadline: float) -> Sender | None:
        config = destinations.alerts
        url = next((_url(w) for w in config.webhooks if label(w) == row.webhook), None)
        return None if url is None else Sender(row.id, row.webhook, url, *_webhook_request(row.payload, config),
                                               config, deadline)


# every kind of alert destination, by name; a row goes to the channel whose prefix its label has
CHANNELS: Registry[AlertChannel] = Registry("alert channel", [
    ("github-culprit", culprit_comment.CulpritCommentChannel()),
    ("github-pr", pull_answer.PullRequestChannel()),
    ("github", github.StatusChannel()),
    ("webhook", WebhookChannel()),
])


def channel_for(webhook: str) -> AlertChannel:
    """The channel of a row labelled ``webhook``: the longest prefix that claims it."""
    claiming = [c for c in CHANNELS.values() if c.claims(webhook)]
    if not claiming:
        raise ValueError(f"alert target {webhook!r}: no channel claims it (channels: {CHANNELS.expected()})")
    return max(claiming, key=lambda c: len(c.prefix))


def deliver_pending(engine: Engine, destinations: Destinations | AlertsConfig, *,
                    stop: threading.Event | None = None, ids: Collection[int] | None = None) -> list[Sent]:
    """Send the pending deliveries whose time has come; at most ``alerts.deadline_s`` in all.

    Rows are claimed first (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, their next attempt moved
    past this round), so two processes never send one delivery at once. No session is open
    while sending. ``ids``: only these rows (a pull request's progress, sent as the job goes). ``stop`` set (SIGTERM in the long-running loops) ends the wait at once; what
    was not sent stays pending. Never raises for a delivery failure.
    """
    if isinstance(destinations, AlertsConfig):  # webhooks only
        destinations = Destinations(destinations)
    config = destinations.alerts
    sessions = sessionmaker(engine, expire_on_commit=False)
    started = time.monotonic()
    deadline = started + config.deadline_s
    with sessions() as session:
        query = (select(AlertDelivery).where(AlertDelivery.status == DeliveryStatus.PENDING,
                                             AlertDelivery.next_at <= utcnow())
                 .order_by(AlertDelivery.id).limit(ROUND_ROWS))
        if ids is not None:
            query = query.where(AlertDelivery.id.in_(list(ids)))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)
        rows = session.scalars(query).all()
        # Deliveries to one destination go in the order they were made (a commit's "pending"
        # status must not land after its "success"): none is sent while an earlier one to the
        # same destination waits for a later round or is another process's to send now.
        held: dict[str, int] = dict(session.execute(
            select(AlertDelivery.webhook, func.min(AlertDelivery.id))
            .where(AlertDelivery.status == DeliveryStatus.PENDING, AlertDelivery.next_at > utcnow())
            .group_by(AlertDelivery.webhook)).all())
        rows = [row for row in rows if row.id < held.get(row.webhook, row.id + 1)]
        senders, unknown = [], []
        for row in rows:
            sender = channel_for(row.webhook).sender(row, destinations, deadline)
            if sender is None:
                unknown.append(row)
                continue
            row.next_at = utcnow() + timedelta(seconds=config.deadline_s + 60)  # claimed for this round
            senders.append(sender)
        for row in unknown:  # another process (one whose config names it) will send it
            row.error = (f"{row.webhook}: not among this process's webhooks or [github] (or its variable is "
                         "unset); a process whose config names it sends it")
        session.commit()
    chains: dict[str, list[Sender]] = {}  # one destination's deliveries, sent one after another
    for sender in senders:
        chains.setdefault(sender.webhook, []).append(sender)
    threads = [threading.Thread(target=_send_in_order, args=(chain,), daemon=True, name=f"alerts-{chain[0].row_id}")
               for chain in chains.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline and not (stop and stop.is_set()):
            thread.join(timeout=0.2)
    results = [s.result or Sent(s.row_id, s.webhook, False, 1, None,
                                f"no answer within the delivery deadline ({config.deadline_s:g} s)", False)
               for s in senders if not (stop and stop.is_set() and s.result is None)]
    _store(sessions, results, config)
    return results


def _send_in_order(chain: list[Sender]) -> None:
    """Send one destination's deliveries in order, in this thread; after one that was not
    delivered, the rest wait for a later round (sent after it, never before)."""
    for number, sender in enumerate(chain):
        sender.run()
        if sender.result is None or not sender.result.ok:
            for later in chain[number + 1:]:
                later.result = Sent(later.row_id, later.webhook, False, 0, None,
                                    f"held: delivery {sender.row_id} to the same destination is not delivered yet",
                                    False)
            return


def _store(sessions: sessionmaker, results: list[Sent], config: AlertsConfig) -> None:
    """Each round's outcome on its row: delivered, pending again (with a later time), or given up."""
    with sessions() as session:
        for sent in results:
            row = session.get(AlertDelivery, sent.delivery_id)
            if row is None:
                continue
            now = utcnow()
            row.attempts += sent.attempts
            row.status_code, row.error = sent.status_code, sent.error
            created = row.at if row.at.tzinfo else row.at.replace(tzinfo=UTC)
            if sent.ok:
                row.status, row.delivered_at, row.next_at = DeliveryStatus.DELIVERED, now, None
            elif sent.final or now - created > timedelta(seconds=config.retry_for_s):
                row.status, row.next_at = DeliveryStatus.GIVEN_UP, None
            else:  # the next round, after a wait that grows with the attempts made
                row.next_at = now + timedelta(seconds=min(3600.0, config.backoff_s * 2 ** min(row.attempts, 12)))
        session.commit()


def notify(engine: Engine, regression_ids: Iterable[int], event: str, config: AlertsConfig) -> list[Sent]:
    """Record ``event`` for each regression (committed at once) and run a delivery round.

    For callers outside a transaction (triage, tests); the watch records its alerts with the
    state change (:func:`enqueue`) and sends them after the job.
    """
    if not config.webhooks:
        return []
    with Session(engine) as session:
        enqueue(session, regression_ids, event, config)
        session.commit()
    return deliver_pending(engine, config)

