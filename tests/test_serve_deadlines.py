"""Connections that hold a place in a real ``abwatch serve`` (uvicorn, 127.0.0.1) without
asking anything: sockets that send half a request line and wait. The server closes them
(a header deadline), makes room for a client at its connection limit, and its defaults bound
every wait."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest
import requests

from abwatch.service.config import ServerConfig
from abwatch.service.web import deadlines
from abwatch.service.web.server import uvicorn_config
from conftest import live_server

SILENT = 60
HALF = b"GET / HTT"  # half a request line, and then nothing


def _silent_sockets(base: str, count: int) -> list[socket.socket]:
    port = int(base.rsplit(":", 1)[1])
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(HALF)
        sockets.append(sock)
    return sockets


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closed ``sock`` (EOF or reset) before ``deadline`` (monotonic)."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            # an answer (uvicorn's 503 at the limit, say) would be data, then EOF: read on
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.mark.slow  # a real server process
def test_silent_sockets_at_the_connection_limit_do_not_shut_a_client_out(fresh_pg_url, tmp_path):
    """The probe: 20 silent sockets with max_connections = 15 gave every client 503. Now the
    oldest silent ones make room for a client at once, and the rest meet their deadline."""
    settings = "max_connections = 15\nheader_timeout_s = 3.0\nkeepalive_timeout_s = 1.0\n"
    with live_server(fresh_pg_url, tmp_path / "srv", extra_config=settings) as base:
        sockets = _silent_sockets(base, SILENT)
        try:
            t0 = time.monotonic()
            answer = requests.get(base + "/api/runs", timeout=2)
            answered_s = time.monotonic() - t0
            assert answer.status_code == 200, answer.text
            assert answered_s < 2, answered_s
            deadline = time.monotonic() + 60
            still_open = [s for s in sockets if not _closed_by_server(s, deadline)]
            closed_s = time.monotonic() - t0
            assert not still_open, f"{len(still_open)} of {SILENT} silent sockets still open after 60 s"
        finally:
            for sock in sockets:
                sock.close()
        # and a client after them is answered as before
        assert requests.get(base + "/api/runs", timeout=5).status_code == 200
    print(f"GET answered in {answered_s * 1000:.0f} ms beside {SILENT} silent sockets; all closed by the server "
          f"within {closed_s:.1f} s")


@pytest.mark.slow  # a real server process
def test_half_sent_requests_are_closed_at_the_header_deadline(fresh_pg_url, tmp_path):
    """Below the limit (the default 1000), silent sockets are closed at ``header_timeout_s``,
    a fresh one and one that got an answer and then started a request it never finished; a
    keep-alive connection left idle is closed at ``keepalive_timeout_s``; a normal GET is
    answered meanwhile."""
    settings = "header_timeout_s = 1.0\nkeepalive_timeout_s = 0.5\n"
    with live_server(fresh_pg_url, tmp_path / "srv", extra_config=settings) as base:
        port = int(base.rsplit(":", 1)[1])
        sockets = _silent_sockets(base, SILENT)
        with contextlib.ExitStack() as stack:
            for sock in sockets:
                stack.callback(sock.close)
            t0 = time.monotonic()
            assert requests.get(base + "/api/runs", timeout=2).status_code == 200
            answered_s = time.monotonic() - t0
            # kept alive after an answer, then half of a second request
            again = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            again.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\n\r\n")
            assert again.recv(4096).startswith(b"HTTP/1.1 200")
            again.sendall(HALF)
            # kept alive after an answer, then nothing
            idle = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            idle.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\n\r\n")
            assert idle.recv(4096).startswith(b"HTTP/1.1 200")
            idle_at = time.monotonic()
            assert _closed_by_server(idle, time.monotonic() + 30)
            idle_s = time.monotonic() - idle_at
            deadline = time.monotonic() + 60
            still_open = [s for s in [*sockets, again] if not _closed_by_server(s, deadline)]
            closed_s = time.monotonic() - t0
            assert not still_open, f"{len(still_open)} half-sent requests still open after 60 s"
            assert closed_s >= 0.9, closed_s  # not at once: at the deadline
        assert requests.get(base + "/api/runs", timeout=5).status_code == 200
    print(f"GET answered in {answered_s * 1000:.0f} ms beside {SILENT} silent sockets; all closed within "
          f"{closed_s:.1f} s (deadline 1 s); an idle keep-alive connection closed after {idle_s:.1f} s")


def test_the_default_deadlines_are_bounded_and_reach_uvicorn():
    server = ServerConfig()
    assert 0 < server.header_timeout_s <= 30 and 0 < server.keepalive_timeout_s <= 30
    config = uvicorn_config(object(), server, "127.0.0.1", 8080)
    assert isinstance(config.http, type) and issubclass(config.http, deadlines.DeadlineProtocol)
    assert config.http.header_timeout_s == server.header_timeout_s
    assert config.timeout_keep_alive == server.keepalive_timeout_s
    assert config.limit_concurrency == server.max_connections
    custom = uvicorn_config(object(), ServerConfig(header_timeout_s=0.5, keepalive_timeout_s=0.25), "::1", 1)
    assert custom.http.header_timeout_s == 0.5 and custom.timeout_keep_alive == 0.25  # type: ignore[union-attr]
    for bad in ({"header_timeout_s": 0}, {"keepalive_timeout_s": 0}, {"header_timeout_s": 301}):
        with pytest.raises(ValueError):
            ServerConfig(**bad)  # type: ignore[arg-type]
