"""A commit as abwatch records it: its summary and author made storable, its time kept as git
wrote it (an instant in UTC and the committer's offset apart)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


# What a commit's text may hold once stored: the authors column's length, and a bound on a
# summary (git puts no limit on either; one pushed commit must not fill a database).
SUMMARY_CHARS = 1000
AUTHOR_CHARS = 256
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str | bytes, limit: int) -> str:
    """``text`` as both databases can store it: bytes decoded as UTF-8 (invalid bytes
    replaced), NUL and lone surrogates replaced by U+FFFD, at most ``limit`` characters.

    PostgreSQL refuses NUL in text and the drivers cannot encode a lone surrogate; git accepts
    both (``git hash-object --literally`` writes any commit), so whatever comes from git or a
    child process passes through here before it can reach a row.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = _SURROGATE.sub("\ufffd", text.replace("\0", "\ufffd"))
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


@dataclass(frozen=True)
class CommitInfo:
    """What abwatch records about one commit (or one release, for release builds).

    The summary and author are made storable (:func:`storable`) on construction: every
    commit read from git is one of these before it is stored, shown or compared.
    """

    sha: str
    summary: str
    author: str
    # The commit time as an instant in UTC, and the committer's UTC offset in minutes apart:
    # git accepts offsets up to +-99:59 (Python's and PostgreSQL's time zones stop before
    # 24 h and 16 h) and any instant, before 1970 too; each database stores these two as they are.
    committed_at: datetime | None
    committed_offset_min: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", storable(self.summary, SUMMARY_CHARS))
        object.__setattr__(self, "author", storable(self.author, AUTHOR_CHARS))
        when = self.committed_at
        if when is not None and when.tzinfo is not None:  # an aware time: its instant and its offset
            offset = when.utcoffset()
            if self.committed_offset_min is None and offset is not None:
                object.__setattr__(self, "committed_offset_min", int(offset.total_seconds()) // 60)
            object.__setattr__(self, "committed_at", when.astimezone(UTC))
        elif when is not None:  # a naive time is taken as UTC
            object.__setattr__(self, "committed_at", when.replace(tzinfo=UTC))

    def local_time(self) -> str | None:
        """The commit time as git shows it, in the committer's offset (``2026-01-07 12:00:00 +2300``)."""
        return format_git_time(self.committed_at, self.committed_offset_min)


def format_git_time(instant: datetime | None, offset_min: int | None) -> str | None:
    """``instant`` (UTC) on the committer's wall clock with git's ``+HHMM`` (any offset git accepts)."""
    if instant is None:
        return None
    offset = offset_min or 0
    sign, size = ("-" if offset < 0 else "+"), abs(offset)
    try:
        wall = instant.replace(tzinfo=None) + timedelta(minutes=offset)
    except OverflowError:  # near year 1 or 9999 the wall clock may lie outside what Python holds
        wall, sign, size = instant.replace(tzinfo=None), "+", 0
    return f"{wall:%Y-%m-%d %H:%M:%S} {sign}{size // 60:02d}{size % 60:02d}"
