"""Infrastructure failures: the machine failed a comparison, not the commit under test.

A full disk (during a checkout, a build, a cache write or a measurement), a build tool the
config names that is not installed, or a database that went away are no verdict on the
commit: ``compare`` exits 5 (not 3), no build row says ``build_failed``, no GitHub ``error``
status blames the commit, and a watch leaves it untested and tries it again at its next pass
(:mod:`service.watch.poll`). :func:`infrastructure` tells such an error from the others.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from abwatch.builders.builder import InfraFailure, disk_full, short_of_space
from abwatch.builders.spec import CacheConfig
from abwatch.service.store import db

PREFIX = "infrastructure failure"  # how a job's error and a run's error begin when it was one


def infrastructure(exc: BaseException) -> str | None:
    """Why ``exc`` is the machine's failure rather than the commit's (None when it is not):
    :class:`~builders.builder.InfraFailure` (a build that found no room, a missing build tool),
    a write of abwatch's own that found no space (ENOSPC/EDQUOT anywhere in the chain, SQLite's
    "database or disk is full"), or a lost database connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InfraFailure):
            return str(current)
        current = current.__cause__ or current.__context__
    if disk_full(exc) or "database or disk is full" in str(exc):
        return f"out of disk space: {type(exc).__name__}: {exc}"
    lost = db.lost_connection(exc)
    if lost is not None:
        text = str(getattr(lost, "orig", None) or lost).strip()
        return f"the database connection was lost: {text.splitlines()[0] if text else type(lost).__name__}"
    return None


def describe(exc: BaseException) -> str | None:
    """The one line a command prints for an infrastructure failure, None for another error."""
    why = infrastructure(exc)
    return None if why is None else f"{PREFIX} (not the commit's; it stays untested): {why}"


def check_measuring(what: str, failure: str, cache_dir: Path, limits: CacheConfig) -> None:
    """Raise :class:`InfraFailure` when a measured process failed (``failure``, of workload
    ``what``) while a file system measuring writes to (the cache, the temporary directory the
    sandboxed processes get theirs under) is short of space: the full disk failed it, not the
    commit. Checked after the failed process's own temporary files are gone, so a workload
    that fills the disk itself is still its commit's failure."""
    short = short_of_space([cache_dir, Path(tempfile.gettempdir())], limits)
    if short is not None:
        raise InfraFailure(f"{what}: {failure}; out of disk space: {short}; "
                           "not the commit's failure, it stays untested")
