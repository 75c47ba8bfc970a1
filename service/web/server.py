"""``abwatch serve``: the API and the dashboard under uvicorn, with the admission limits'
database pool (:mod:`.admission`)."""

from __future__ import annotations

import uvicorn

from abwatch.service.config import Config, ServerConfig
from abwatch.service.store import db
from abwatch.service.web.api import create_app


def server_engine(url: str, server: ServerConfig):
    """The server's engine: a pool of ``max_in_flight`` connections, no overflow, short waits, and
    ``statement_timeout`` on PostgreSQL."""
    return db.make_engine(url, pool_size=server.max_in_flight, pool_timeout_s=server.pool_timeout_s,
                          statement_timeout_s=server.statement_timeout_s)


def serve(url: str, config: Config, host: str, port: int) -> int:
    """Run the API and dashboard under uvicorn on ``host:port`` with ``config.server``'s limits."""
    engine = server_engine(url, config.server)
    app = create_app(engine, config.server, config.alerts, config)
    try:
        # limit_concurrency: the outermost guard, on open connections (its 503 is uvicorn's own)
        uvicorn.run(app, host=host, port=port, log_level="info", limit_concurrency=config.server.max_connections)
    finally:
        engine.dispose()
    return 0
