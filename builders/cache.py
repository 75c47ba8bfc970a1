"""The artifact cache: one directory per build key, usable only once its marker exists.

Layout (after asv): ``{root}/{key}/`` holds the artifact, ``{root}/{key}/.abwatch-complete``
is written last, so a crash mid-copy leaves an entry that is never used (and is replaced
by the next build). Entries are filled under an exclusive ``flock`` on ``{root}/{key}.lock``,
so two builders of one key on this machine wait for each other instead of building twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

MARKER = ".abwatch-complete"


class ArtifactCache:
    """A directory of completed build artifacts keyed by a content hash."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """Where the artifact of ``key`` lives (complete or not)."""
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"invalid artifact key {key!r}")
        return self.root / key

    def get(self, key: str) -> Path | None:
        """The artifact directory of ``key`` if it is complete, else None."""
        path = self.path(key)
        return path if (path / MARKER).is_file() else None

    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the exclusive lock of ``key`` (blocks while another process holds it)."""
        with open(self.root / f"{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def staging(self, key: str) -> Path:
        """A fresh directory inside the cache root to build ``key`` in place (same file system)."""
        return Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))

    def adopt(self, key: str, staging: Path, info: dict) -> Path:
        """Move a directory built by :meth:`staging` into place as ``key``; marker last.

        For artifacts that must not be copied after they are made (a venv records its path).
        Call with the key's lock held.
        """
        final = self.path(key)
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
        self._mark(final, info)
        return final

    def put(self, key: str, source: Path, info: dict) -> Path:
        """Copy ``source`` into the cache as ``key``; the marker (with ``info``) goes last.

        Call with the key's lock held. A stale incomplete entry is replaced.
        """
        final = self.path(key)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        try:
            shutil.copytree(source, staging / "a", symlinks=True)
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging / "a", final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._mark(final, info)
        return final

    @staticmethod
    def _mark(final: Path, info: dict) -> None:
        stamp = dict(info, stored_at=datetime.now(timezone.utc).isoformat())
        marker_tmp = final / f"{MARKER}.tmp"
        marker_tmp.write_text(json.dumps(stamp, sort_keys=True))
        os.replace(marker_tmp, final / MARKER)
