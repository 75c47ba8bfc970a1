"""What a crowd gets from ``abwatch serve``: a rate limit per client, a bound on the work in
flight, a deadline on every query, and fast refusals instead of queues.

Four layers, outermost first (each refusal costs no thread and no database connection):

- :class:`SignedDeliveries`: a GitHub delivery whose signature verifies is marked
  (:data:`SIGNED`) and passes the next two layers; it takes one of
  ``server.webhook_in_flight`` turns of its own instead, waiting as long as it must (GitHub
  does not deliver again by itself, so a refused delivery would be a lost command).
- :class:`RateLimit`: requests without the write token are counted per client address with
  the ``limits`` library (moving window, ``server.rate_limit``); past it, 429 with
  ``Retry-After``. Requests with the valid token, and signed deliveries, are not rate-limited.
- :class:`Capacity`: at most ``server.max_in_flight`` requests are worked on at once; one past
  it waits up to ``server.queue_s`` for a turn, then gets 503 with ``Retry-After``. A turn ends
  when the response starts (the database work is done by then: the session closes when the
  route returns), so a client that reads its answer slowly holds no turn.
- The database: a pool of ``max_in_flight + webhook_in_flight`` connections (a request that got a turn finds one),
  ``pool_timeout_s`` to get one and PostgreSQL's ``statement_timeout`` on each, both answered
  503 (:func:`database_unavailable`) rather than 500.

Before this, 500 concurrent GETs queued on Starlette's 40 threads behind a pool of 5+10
connections: 500s after the pool's 30 s timeout, and minutes of queue after the burst.
"""

import logging
import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from sqlalchemy import exc as sa_exc
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from abwatch.service.config import GithubConfig, ServerConfig
from abwatch.service.watch import pulls
from abwatch.service.web.github_hooks import PATH as WEBHOOK_PATH

log = logging.getLogger("abwatch.serve")

# Threads beyond max_in_flight: static files are read in threads after a request's turn ended.
SPARE_THREADS = 4
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement cancelled (statement_timeout)
SIGNED = "abwatch.signed"  # the ASGI scope's mark of a delivery whose signature verified


async def _answer(scope: Scope, receive: Receive, send: Send, status: int, detail: str, retry_after: int) -> None:
    response = JSONResponse({"detail": detail}, status_code=status, headers={"Retry-After": str(retry_after)})
    await response(scope, receive, send)


class RateLimit:
    """Pure ASGI middleware: per-client rate limit of requests without the write token (429)."""

    def __init__(self, app: ASGIApp, api) -> None:
        self.app, self.api = app, api
        text = api.server.rate_limit
        self.items: list[RateLimitItem] = parse_many(text) if text.strip() else []
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.items or scope.get(SIGNED):
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        if authorization and self.api.token_problem(authorization) is None:
            await self.app(scope, receive, send)  # the token's holder: no rate limit
            return
        # behind a reverse proxy, uvicorn puts the address it forwarded for here (FORWARDED_ALLOW_IPS)
        client = (scope.get("client") or ("unknown", 0))[0]
        # test every limit before counting any, so a refused request counts against none
        if all(self.limiter.test(item, client) for item in self.items):
            for item in self.items:
                self.limiter.hit(item, client)
            await self.app(scope, receive, send)
            return
        now = time.time()
        wait = max(math.ceil(self.limiter.get_window_stats(item, client).reset_time - now)
                   for item in self.items if not self.limiter.test(item, client))
        await _answer(scope, receive, send, 429,
                      f"too many requests from {client} (limit without the token: {self.api.server.rate_limit}); "
                      f"retry after {max(1, wait)} s", max(1, wait))


class Capacity:
    """Pure ASGI middleware: at most ``max_in_flight`` requests worked on at once (503 past it)."""

    def __init__(self, app: ASGIApp, server: ServerConfig) -> None:
        self.app, self.server = app, server
        self.turns = anyio.Semaphore(server.max_in_flight)

    async def _take_turn(self) -> bool:
        try:
            self.turns.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        with anyio.move_on_after(self.server.queue_s):
            await self.turns.acquire()
            return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get(SIGNED):  # signed deliveries have turns of their own
            await self.app(scope, receive, send)
            return
        if not await self._take_turn():
            await _answer(scope, receive, send, 503,
                          f"the server is at capacity ({self.server.max_in_flight} requests in flight); "
                          "try again shortly", max(1, math.ceil(self.server.queue_s)))
            return
        await _in_turn(self.app, scope, receive, send, self.turns)


async def _in_turn(app: ASGIApp, scope: Scope, receive: Receive, send: Send, turns: anyio.Semaphore) -> None:
    """Run ``app`` holding a turn of ``turns`` (taken by the caller) until its answer starts."""
    held = True

    def end_turn() -> None:
        nonlocal held
        if held:
            held = False
            turns.release()

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            end_turn()  # the work is done; sending the answer holds no turn
        await send(message)

    try:
        await app(scope, receive, sending)
    finally:
        end_turn()


class SignedDeliveries:
    """Pure ASGI middleware, outermost: GitHub deliveries whose signature verifies get their
    own ``webhook_in_flight`` turns, and no rate limit.

    Only a POST to the webhook's path that carries ``X-Hub-Signature-256`` has its body read
    here (up to ``max_body_mb``; 413 past it) and its signature checked. One that verifies is
    marked :data:`SIGNED` and waits for a turn, however long; one that does not goes on like
    any request (counted by the rate limit, refused 401 by the route). The route checks the
    signature again: this mark only decides admission.
    """

    def __init__(self, app: ASGIApp, server: ServerConfig, github: GithubConfig | None) -> None:
        self.app, self.server, self.github = app, server, github
        self.turns = anyio.Semaphore(server.webhook_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else None
        if (headers is None or self.github is None or scope["method"] != "POST" or scope["path"] != WEBHOOK_PATH
                or pulls.SIGNATURE_HEADER.lower() not in headers):
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, send, int(self.server.max_body_mb * 2**20))
        if body is None:
            return
        replay = replaying(body, receive)
        secret = os.environ.get(self.github.webhook_secret_env, "")
        if not (secret and pulls.verify_signature(secret, body, headers.get(pulls.SIGNATURE_HEADER))):
            await self.app(scope, replay, send)
            return
        scope[SIGNED] = True
        await self.turns.acquire()  # no deadline: a signed delivery is queued, never refused
        await _in_turn(self.app, scope, replay, send, self.turns)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)


async def read_body(scope: Scope, receive: Receive, send: Send, limit: int) -> bytes | None:
    """A request's whole body, read before the application sees it; ``None`` when the client
    left or the body passed ``limit`` bytes (then answered 413 here)."""
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            await _refuse(scope, receive, send, 413, f"request body is over the limit of {limit} bytes")
            return None
        more = message.get("more_body", False)
    return body


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the application ``body`` (already read) once, then the client's."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with ``Retry-After`` for a request whose database work could not be done in time:
    no free connection within ``pool_timeout_s``, a query cancelled by ``statement_timeout``,
    or a database that cannot be reached. The cause goes to the log, not to the client."""
    server: ServerConfig = request.app.state.api.server
    if isinstance(exc, sa_exc.TimeoutError):
        detail = f"no database connection was free within {server.pool_timeout_s:g} s; try again shortly"
    elif getattr(getattr(exc, "orig", None), "pgcode", None) == QUERY_CANCELED:
        detail = f"the query ran past the server's deadline ({server.statement_timeout_s:g} s) and was cancelled"
    else:
        detail = "the database is unavailable; try again shortly"
    log.warning("%s %s: 503: %s (%s)", request.method, request.url.path, detail, str(exc).splitlines()[0][:300])
    return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "5"})


def install(app: FastAPI, api, github: GithubConfig | None = None) -> None:
    """Put the signed deliveries' turns, the rate limit and the 503 handlers on ``app``; call
    after every other middleware so these run first (Starlette runs the last one added first)."""
    app.add_exception_handler(sa_exc.TimeoutError, database_unavailable)
    app.add_exception_handler(sa_exc.OperationalError, database_unavailable)
    app.add_middleware(RateLimit, api=api)
    app.add_middleware(SignedDeliveries, server=api.server, github=github)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Size Starlette's worker threads (default 40) to the requests in flight (reads' turns and
    signed deliveries' turns), plus a few for files."""
    server: ServerConfig = app.state.api.server
    threads = server.max_in_flight + server.webhook_in_flight + SPARE_THREADS
    anyio.to_thread.current_default_thread_limiter().total_tokens = threads
    yield
