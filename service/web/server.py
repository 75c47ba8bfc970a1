"""``abwatch serve``: the API and the dashboard under uvicorn, with the admission limits'
database pool (:mod:`.admission`) and deadlines on connections that ask nothing
(:mod:`.deadlines`)."""

from __future__ import annotations

import uvicorn

from abwatch.service.config import Config, ServerConfig
from abwatch.service.exits import EXIT_INTERNAL
from abwatch.service.store import db
from abwatch.service.web import deadlines
from abwatch.service.web.api import create_app


def server_engine(url: str, server: ServerConfig):
    """The server's engine: a connection for each turn (``max_in_flight`` reads' and
    ``webhook_in_flight`` signed deliveries'), no overflow, short waits, and ``statement_timeout``
    on PostgreSQL."""
    return db.make_engine(url, pool_size=server.max_in_flight + server.webhook_in_flight,
                          pool_timeout_s=server.pool_timeout_s,
                          statement_timeout_s=server.statement_timeout_s)


def uvicorn_config(app, server: ServerConfig, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for ``app``: ``server``'s connection limit and deadlines.

    The h11 protocol (:class:`.deadlines.DeadlineProtocol`), whichever parsers are installed:
    uvicorn itself has no deadline on a request's head."""
    return uvicorn.Config(
        app, host=host, port=port, log_level="info",
        # limit_concurrency: the outermost guard, on open connections (its 503 is uvicorn's own)
        limit_concurrency=server.max_connections,
        # uvicorn types it int, but only hands it to loop.call_later: a fraction of a second is fine
        timeout_keep_alive=server.keepalive_timeout_s,  # type: ignore[arg-type]
        http=deadlines.protocol(server.header_timeout_s))


def serve(url: str, config: Config, host: str, port: int) -> int:
    """Run the API and dashboard under uvicorn on ``host:port`` with ``config.server``'s limits."""
    engine = server_engine(url, config.server)
    app = create_app(engine, config.server, config.alerts, config)
    try:
        server = uvicorn.Server(uvicorn_config(app, config.server, host, port))
        server.run()
    finally:
        engine.dispose()
    # uvicorn logged why it did not start (the port taken, say)
    return 0 if server.started else EXIT_INTERNAL
