"""GitHub commit statuses: each tested commit gets ``abwatch/<device>`` set to ``pending`` when
the watch queues it, then ``success`` (no regression), ``failure`` (a confirmed regression,
or the culprit bisection named) or ``error`` (its build failed or it could not be judged).

Statuses go through the alert outbox (:mod:`.alerts`): recorded in the transaction that
decided them, sent after the job with the same retries, deadline and record of each attempt.
The token comes from the environment variable ``[github] token_env`` when a status is sent;
it is never stored.
"""

from __future__ import annotations

import json
import os

from sqlalchemy.orm import Session

from abwatch.service.config import GithubConfig
from abwatch.service.notify.channels import AlertChannel, Destinations, Sender
from abwatch.service.store.models import AlertDelivery, DeliveryStatus, utcnow

EVENT = "status"
STATES = ("pending", "success", "failure", "error")
DESCRIPTION_MAX = 140  # GitHub refuses longer descriptions


def label(config: GithubConfig) -> str:
    """How a status delivery names its target (the outbox's ``webhook`` column)."""
    return f"github:{config.repo}"


def enqueue(session: Session, config: GithubConfig | None, sha: str, state: str, device: str,
            description: str, target_url: str | None = None) -> bool:
    """Record one status for ``sha`` in the caller's transaction; False without ``[github]``."""
    if config is None:
        return False
    if state not in STATES:
        raise ValueError(f"commit status {state!r}: expected one of {STATES}")
    now = utcnow()
    session.add(AlertDelivery(
        regression_id=None, event=EVENT, webhook=label(config), status=DeliveryStatus.PENDING, attempts=0,
        payload={"sha": sha, "state": state, "context": f"{config.context}/{device}",
                 "description": description[:DESCRIPTION_MAX], "target_url": target_url},
        at=now, next_at=now))
    return True


def request(config: GithubConfig, payload: dict) -> tuple[str, bytes, dict[str, str]] | None:
    """(URL, body, headers) of ``POST /repos/{owner}/{repo}/statuses/{sha}``; None while the
    token's variable is unset (the delivery waits for a process that has it)."""
    token = os.environ.get(config.token_env)
    if not token:
        return None
    url = f"{config.api_url.rstrip('/')}/repos/{config.repo}/statuses/{payload['sha']}"
    body = {"state": payload["state"], "context": payload["context"], "description": payload["description"]}
    if payload.get("target_url"):
        body["target_url"] = payload["target_url"]
    headers = {"Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",
               "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "abwatch-statuses",
               "Content-Type": "application/json"}
    return url, json.dumps(body, sort_keys=True).encode(), headers


def run_url(dashboard_url: str | None, run_id: int | None) -> str | None:
    """The run page a status links to."""
    return f"{dashboard_url.rstrip('/')}/runs/{run_id}" if dashboard_url and run_id else None


class StatusChannel(AlertChannel):
    """Commit statuses (``github:owner/name``): one POST each, with ``[github]``'s token."""

    prefix = "github:"

    def sender(self, row: AlertDelivery, destinations: Destinations, deadline: float) -> Sender | None:
        config = destinations.github
        if config is None or label(config) != row.webhook:
            return None
        prepared = request(config, row.payload)
        return None if prepared is None else Sender(row.id, row.webhook, *prepared, destinations.alerts, deadline)
