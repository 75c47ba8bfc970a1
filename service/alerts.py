"""Alerts: a webhook POST to each configured URL when a regression is confirmed or fixed.

Payload (JSON, ``Content-Type: application/json``)::

    {"event": "regress" | "fixed",
     "text": "<one line a person reads; Slack's incoming webhooks show it as the message>",
     "regression": {"id", "workload", "device", "kind", "state", "change_pct", "good_sha",
                    "bad_sha", "culprit_sha", "culprit_summary", "run_id", "url"},
     "sent_at": "<ISO 8601 time>", "delivery": "<uuid, the same for every attempt>"}

Headers: ``X-Abwatch-Event``, ``X-Abwatch-Delivery`` and, when the environment variable
named by ``alerts.secret_env`` holds a secret, ``X-Abwatch-Signature-256: sha256=<hex>``,
the HMAC-SHA256 of the exact body bytes with that secret (GitHub's scheme; receivers
compare it in constant time). A connection error, a timeout, a 429 or a 5xx is retried
``alerts.attempts`` times with doubling waits; every attempt is stored in
``alert_deliveries``. Nothing here runs inside the caller's database transaction, and every
request has a bounded timeout and deliveries run side by side, so dead endpoints delay the
watch by at most ``attempts × timeout_s`` plus the waits in all, and never fail it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

import requests
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from abwatch.service.config import AlertsConfig
from abwatch.service.models import AlertDelivery, Regression, SILENCED_TRIAGE, utcnow

SIGNATURE_HEADER = "X-Abwatch-Signature-256"
MAX_PARALLEL = 16
EVENTS = ("regress", "fixed")


@dataclass(frozen=True)
class Attempt:
    """One delivery attempt's outcome."""

    url: str
    attempt: int
    ok: bool
    status_code: int | None
    error: str | None


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str) -> bool:
    """What a receiver does: recompute and compare in constant time."""
    return hmac.compare_digest(sign(secret, body), header or "")


def payload(regression: Regression, event: str, dashboard_url: str | None = None) -> dict:
    """The JSON document sent for ``regression`` reaching state ``event``."""
    if event not in EVENTS:
        raise ValueError(f"alert event {event!r}: expected one of {EVENTS}")
    bad, good = regression.treatment_commit, regression.control_commit
    device = regression.device.name if regression.device else "?"
    url = f"{dashboard_url.rstrip('/')}/regressions/{regression.id}" if dashboard_url else None
    kind = "runtime" if regression.kind == "speed" else regression.kind
    if event == "regress":
        text = (f"abwatch: {regression.workload.name} on {device} is {regression.change_pct:+.2f}% slower "
                f"({kind}) since {bad.sha[:12]} \"{bad.summary}\" (regression #{regression.id}, confirmed)")
    else:
        text = (f"abwatch: {regression.workload.name} on {device} is fixed: regression #{regression.id} "
                f"({regression.change_pct:+.2f}% at {bad.sha[:12]}) no longer reproduces")
    if url:
        text += f" <{url}>"
    return {
        "event": event, "text": text,
        "regression": {
            "id": regression.id, "workload": regression.workload.name, "device": device, "kind": kind,
            "state": regression.state.value, "change_pct": regression.change_pct,
            "good_sha": good.sha, "bad_sha": bad.sha, "culprit_sha": bad.sha, "culprit_summary": bad.summary,
            "run_id": regression.run_id, "url": url,
        },
        "sent_at": utcnow().isoformat(), "delivery": str(uuid.uuid4()),
    }


def deliver(url: str, document: dict, config: AlertsConfig, *,
            sleep: Callable[[float], None] = time.sleep) -> list[Attempt]:
    """POST ``document`` to ``url`` until it is accepted or the attempts are spent."""
    body = json.dumps(document, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "abwatch-alerts",
               "X-Abwatch-Event": document["event"], "X-Abwatch-Delivery": document["delivery"]}
    secret = os.environ.get(config.secret_env)
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    attempts = []
    for number in range(1, config.attempts + 1):
        try:
            response = requests.post(url, data=body, headers=headers, timeout=(config.timeout_s, config.timeout_s),
                                     allow_redirects=False)
            ok = 200 <= response.status_code < 300
            attempts.append(Attempt(url, number, ok, response.status_code,
                                    None if ok else f"HTTP {response.status_code}: {response.text[:200]}"))
            # 4xx other than 429 will not get better by asking again
            if ok or (400 <= response.status_code < 500 and response.status_code != 429):
                break
        except requests.RequestException as exc:
            attempts.append(Attempt(url, number, False, None, f"{type(exc).__name__}: {exc}"[:500]))
        if number < config.attempts:
            sleep(config.backoff_s * 2 ** (number - 1))
    return attempts


def notify(engine: Engine, regression_ids: Iterable[int], event: str, config: AlertsConfig, *,
           sleep: Callable[[float], None] = time.sleep) -> list[Attempt]:
    """Send ``event`` for each regression to every webhook and store every attempt.

    Call it after the caller committed: it reads in one short session, sends with no
    session open, then stores the attempts in another. Regressions triaged as expected
    or invalid are not alerted. Never raises for a delivery failure.
    """
    if not config.webhooks:
        return []
    sessions = sessionmaker(engine, expire_on_commit=False)
    with sessions() as session:
        documents = [(r.id, payload(r, event, config.dashboard_url))
                     for r in (session.get(Regression, i) for i in regression_ids)
                     if r is not None and r.triage not in SILENCED_TRIAGE]
    jobs = [(regression_id, document, url) for regression_id, document in documents for url in config.webhooks]
    sent: list[tuple[int, dict, Attempt]] = []
    # side by side: however many regressions and webhooks, the wait is one delivery's bound
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(jobs)))) as pool:
        futures = [(regression_id, document, pool.submit(deliver, url, document, config, sleep=sleep))
                   for regression_id, document, url in jobs]
        for regression_id, document, future in futures:
            sent += [(regression_id, document, a) for a in future.result()]
    with sessions() as session:
        _store(session, sent)
        session.commit()
    return [a for _, _, a in sent]


def _store(session: Session, sent: list[tuple[int, dict, Attempt]]) -> None:
    for regression_id, document, a in sent:
        session.add(AlertDelivery(regression_id=regression_id, event=document["event"], url=a.url,
                                  attempt=a.attempt, ok=a.ok, status_code=a.status_code, error=a.error,
                                  payload=document, at=utcnow()))
