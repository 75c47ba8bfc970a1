"""The artifact cache: one directory per build key, usable only once its marker exists.

Layout (after asv): ``{root}/{key}/`` holds the artifact, ``{root}/{key}/.abwatch-complete``
is written last, so a crash mid-copy leaves an entry that is never used (and is replaced
by the next build). Entries are filled under an exclusive ``flock`` on ``{root}/{key}.lock``,
so two builders of one key on this machine wait for each other instead of building twice.

``put_deduplicated`` stores files by content in ``{root}/.objects/`` and hard-links them
into the entry, so artifacts of neighbouring commits share every unchanged file (ten
Python-only commits keep one copy of a large library). Using an entry touches its marker;
``evict`` removes the least recently used entries until the cache fits its limit.
"""

from __future__ import annotations

import fcntl
import hashlib
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
        """The artifact directory of ``key`` if it is complete, else None (a hit counts as a use)."""
        path = self.path(key)
        marker = path / MARKER
        if not marker.is_file():
            return None
        os.utime(marker)  # least-recently-used eviction reads this
        return path

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

    def put_deduplicated(self, key: str, source: Path, info: dict) -> Path:
        """Like :meth:`put`, but every regular file is a hard link to a content-addressed object."""
        objects = self.root / ".objects"
        staging = self.staging(key)
        try:
            for dirpath, dirnames, filenames in os.walk(source):
                rel = Path(dirpath).relative_to(source)
                (staging / rel).mkdir(parents=True, exist_ok=True)
                for name in filenames:
                    src, dst = Path(dirpath) / name, staging / rel / name
                    if src.is_symlink():
                        os.symlink(os.readlink(src), dst)
                        continue
                    digest = _sha256(src)
                    obj = objects / digest[:2] / digest
                    if not obj.exists():
                        obj.parent.mkdir(parents=True, exist_ok=True)
                        tmp = obj.with_suffix(f".tmp{os.getpid()}")
                        shutil.copy2(src, tmp)
                        os.replace(tmp, obj)
                    os.link(obj, dst)
            return self.adopt(key, staging, info)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def size_bytes(self) -> int:
        """Bytes on disk, each hard-linked file counted once."""
        seen, total = set(), 0
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                st = os.lstat(Path(dirpath) / name)
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
        return total

    def entries(self) -> list[tuple[float, str]]:
        """(last use, key) of every complete entry, least recently used first."""
        found = []
        for child in self.root.iterdir():
            marker = child / MARKER
            if child.is_dir() and not child.name.startswith(".") and marker.is_file():
                found.append((marker.stat().st_mtime, child.name))
        return sorted(found)

    def evict(self, limit_bytes: int, keep: set[str] = frozenset()) -> list[str]:
        """Remove least recently used entries (never those in ``keep``) until within the limit."""
        removed = []
        for _, key in self.entries():
            if self.size_bytes() <= limit_bytes:
                break
            if key in keep:
                continue
            with open(self.root / f"{key}.lock", "w") as handle:
                try:  # an entry another builder holds is in use: skip it rather than wait
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                shutil.rmtree(self.path(key), ignore_errors=True)
            removed.append(key)
        if removed:
            self._collect_objects()
        return removed

    def _collect_objects(self) -> None:
        """Delete content objects no entry links to any more."""
        objects = self.root / ".objects"
        if objects.is_dir():
            for obj in objects.glob("*/*"):
                if obj.stat().st_nlink == 1:
                    obj.unlink()

    @staticmethod
    def _mark(final: Path, info: dict) -> None:
        stamp = dict(info, stored_at=datetime.now(timezone.utc).isoformat())
        marker_tmp = final / f"{MARKER}.tmp"
        marker_tmp.write_text(json.dumps(stamp, sort_keys=True))
        os.replace(marker_tmp, final / MARKER)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
