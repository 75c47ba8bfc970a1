"""What ``abwatch cache`` says of a tvm-source configuration's compiler cache: the local ccache
directory and its lifetime counts, the shared remote storage and whether it answers now, and
the hits of the newest tvm-source builds stored in the database (each build's own counts,
kept in its row's metrics: :func:`service.read.serialize.compiler_cache_json`)."""

from __future__ import annotations


from sqlalchemy.exc import SQLAlchemyError

from abwatch.core.redact import mask_secrets, mask_url
from abwatch.builders.compiler_cache import lifetime_stats, reach
from abwatch.builders.spec import TvmSourceBuildConfig
from abwatch.builders.build_tools import tool
from abwatch.service.config import Config
from abwatch.service.read import stored
from abwatch.service.read.serialize import build_json, compiler_cache_json
from abwatch.service.store import db

BUILDS_SHOWN = 10


def compiler_cache_report(config: Config, database_url: str, limit: int = BUILDS_SHOWN) -> dict | None:
    """The compiler cache of ``config`` (None unless it builds from source): ``dir``, ``lifetime``
    (its counts since ccache's counters were last zeroed, or None), ``remote`` (the URL as shown,
    or None), ``remote_reachable`` and ``remote_problem`` (a TCP connect now), ``builds`` (the
    newest tvm-source builds of the database at ``database_url``) and ``builds_note`` (why
    there are none to show, when the database could not be read)."""
    if not isinstance(config.build, TvmSourceBuildConfig):
        return None
    local = config.cache_dir / "ccache"
    ccache = tool("ccache")
    lifetime = lifetime_stats(ccache, local) if ccache else None
    remote = config.build.ccache_remote
    problem = reach(remote) if remote else None
    builds, note = _builds(database_url, limit)
    return {"dir": str(local), "lifetime": compiler_cache_json(lifetime.metrics()) if lifetime else None,
            "remote": mask_url(remote) if remote else None,
            "remote_reachable": None if remote is None else problem is None, "remote_problem": problem,
            "builds": builds, "builds_note": note}


def _builds(url: str, limit: int) -> tuple[list[dict], str | None]:
    """The newest tvm-source builds at ``url``, or none and why (this command reads a database
    only where one is: a missing SQLite file is not created)."""
    try:
        absent = db.missing_database(url)
        if absent:
            return [], absent
        engine = db.open_database(url, write=False)
        try:
            with db.session_scope(engine) as session:
                return [build_json(b) for b in stored.list_builds(session, limit=limit, builder="tvm-source")], None
        finally:
            engine.dispose()
    except (SQLAlchemyError, db.DatabaseUrlError, db.SchemaError) as exc:
        return [], mask_secrets(f"builds not read: {str(exc).splitlines()[0]}")
