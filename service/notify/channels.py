"""Alert channels: where an outbox row (``alert_deliveries``) is sent, and how.

A row names its target in its ``webhook`` column by a label whose prefix says the channel
(``github:owner/name`` a commit status, ``github-pr:owner/name`` a pull request's comment,
``github-culprit:owner/name`` a comment on a culprit's pull request, anything else a webhook). Each channel is a small :class:`AlertChannel`: the prefix it
claims and the :class:`Sender` that delivers a row, or None when this process cannot (its
config does not name the target, or a token's variable is unset). The channels are
registered by name in :data:`abwatch.service.notify.alerts.CHANNELS`; a new kind of
destination is one module and one line there.

:class:`Sender` is one delivery's attempts in a daemon thread, retried as ``[alerts]`` says
and cut at the round's deadline; a channel whose delivery is more than one POST overrides
:meth:`Sender._post`.
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

import requests

from abwatch.service.config import AlertsConfig, GithubConfig
from abwatch.service.store.models import AlertDelivery


@dataclass(frozen=True)
class Destinations:
    """What a sending process knows of the targets: its ``[alerts]`` and, where set, ``[github]``."""

    alerts: AlertsConfig
    github: GithubConfig | None = None


@dataclass(frozen=True)
class Sent:
    """What one round did with one delivery."""

    delivery_id: int
    webhook: str
    ok: bool
    attempts: int
    status_code: int | None
    error: str | None
    final: bool  # no use asking again (delivered, or a 4xx other than 429)


class Sender(threading.Thread):
    """One delivery's attempts, in a daemon thread: nothing waits for it past the deadline."""

    def __init__(self, row_id: int, webhook: str, url: str, body: bytes, headers: dict[str, str],
                 config: AlertsConfig, deadline: float) -> None:
        super().__init__(daemon=True, name=f"alert-{row_id}")
        self.row_id, self.webhook, self.url, self.body, self.headers = row_id, webhook, url, body, headers
        self.config, self.deadline = config, deadline
        self.result: Sent | None = None

    def run(self) -> None:
        body, headers = self.body, self.headers
        status, error, number, final = None, None, 0, False
        for number in range(1, self.config.attempts + 1):
            try:
                status = self._post(body, headers)
                error = None if 200 <= status < 300 else f"HTTP {status}"
            except (requests.RequestException, TimeoutError) as exc:
                status, error = None, self._scrub(f"{type(exc).__name__}: {exc}")[:500]
            final = error is None or (status is not None and 400 <= status < 500 and status != 429)
            if final:
                break
            wait = self.config.backoff_s * 2 ** (number - 1)
            if number == self.config.attempts or time.monotonic() + wait >= self.deadline:
                break
            time.sleep(wait)
        self.result = Sent(self.row_id, self.webhook, error is None, number, status, error, final)

    def _scrub(self, text: str) -> str:
        """``text`` (an exception's words, which quote the URL or its path) without the secret."""
        path = urlsplit(self.url).path
        text = text.replace(self.url, self.webhook)
        return text.replace(path, "/\u2026") if len(path) > 1 else text

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        """POST and read the answer, within the round's deadline however slowly it comes."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left in this round")
        timeout = min(self.config.timeout_s, left)
        with requests.post(self.url, data=body, headers=headers, timeout=(timeout, timeout),
                           allow_redirects=False, stream=True) as response:
            for _ in response.iter_content(4096):  # a trickling body is cut at the deadline
                if time.monotonic() > self.deadline:
                    raise TimeoutError(f"HTTP {response.status_code}, but the body was still coming "
                                       "at the delivery deadline")
            return response.status_code


class AlertChannel(abc.ABC):
    """One kind of alert destination, known by the prefix of its rows' labels."""

    prefix: ClassVar[str]  # "" claims every label no other channel claims (webhooks)

    def claims(self, label: str) -> bool:
        """Whether a row labelled ``label`` is this channel's."""
        return label.startswith(self.prefix)

    @abc.abstractmethod
    def sender(self, row: AlertDelivery, destinations: Destinations, deadline: float) -> Sender | None:
        """The thread that delivers ``row`` by ``deadline``; None if this process cannot send it."""
