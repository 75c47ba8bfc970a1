"""Deadlines on connections that hold a place in ``abwatch serve`` without asking anything.

uvicorn closes a keep-alive connection left idle ``timeout_keep_alive`` after an answer, but
nothing closes one that never completes a request's head: a socket that sends ``GET / HTT``
and waits holds its place forever, and ``max_connections`` (uvicorn's ``limit_concurrency``)
of them answer every other client 503 (webhook deliveries included). :class:`DeadlineProtocol`
is uvicorn's h11 protocol with two additions:

- a header deadline: the request line and headers must arrive within ``header_timeout_s`` of
  the connection opening, or of its previous answer being sent (a keep-alive connection that
  starts a request and stops), or the connection is closed;
- room at the limit: when a new connection brings the open ones to ``max_connections``, the
  oldest connections with no request in progress (silent, half-sent, idle keep-alive) are
  closed to make room, so silent sockets cannot shut a client out even before their deadline.

A connection whose request is being worked on is never closed by either: its head arrived,
and the answer's own limits (the admission layers, ``statement_timeout``) bound it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("abwatch.serve")


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and idle connections closed at the limit
    (see the module's docstring); :func:`protocol` sets the deadline."""

    header_timeout_s: ClassVar[float] = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since = time.monotonic()  # since when it has had no request in progress

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.in_request():  # the head arrived: the deadline is met
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if not self.in_request() and not self.transport.is_closing():
            self._arm()  # the next request's head has its own deadline

    def in_request(self) -> bool:
        """Whether a request's head arrived and its answer is not sent yet."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._waiting_since = time.monotonic()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.in_request():
            self.close(f"no request head within {self.header_timeout_s:g} s")

    def close(self, why: str) -> None:
        """Close the connection (it has no request in progress); ``why`` goes to the debug log."""
        if self.transport.is_closing():
            return
        log.debug("%s: connection closed: %s", f"{self.client[0]}:{self.client[1]}" if self.client else "?", why)
        with contextlib.suppress(h11.LocalProtocolError):  # the client was part-way through a request
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def _make_room(self) -> None:
        """At ``limit_concurrency`` open connections, close the oldest that have no request in
        progress, so that this one's request finds a place (uvicorn answers 503 at the limit)."""
        limit = self.limit_concurrency
        if limit is None:
            return
        # a closed transport leaves `connections` only at connection_lost, on the next loop turn
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        excess = len(open_) - (limit - 1)
        if excess <= 0:
            return
        idle = sorted((c for c in open_ if c is not self and isinstance(c, DeadlineProtocol) and not c.in_request()),
                      key=lambda c: c._waiting_since)
        for connection in idle[:excess]:
            connection.close(f"{limit} connections open: the oldest with no request in progress makes room")


def protocol(header_timeout_s: float) -> type[DeadlineProtocol]:
    """The protocol class to give uvicorn (``http=``), with this header deadline."""
    return type("DeadlineProtocol", (DeadlineProtocol,), {"header_timeout_s": header_timeout_s})
