"""Content-addressed file objects for the artifact cache, whole or as binary deltas.

Every file of a deduplicated artifact is a hard link to ``{root}/<aa>/<sha256>``, so
artifacts of neighbouring commits share the files they have in common. A library that a
commit relinks differs from its neighbour's in a few places but is a new file; keeping it
whole for every commit would grow the cache by one library per commit. Such an object can
instead be kept as a *delta*: ``<sha256>.zst`` holds it compressed by Zstandard with its
base object (a similar file, usually the same library of a newer commit) as a raw-content
dictionary — what ``zstd --patch-from`` does — and ``<sha256>.delta.json``, written last,
names the base. :meth:`ObjectStore.materialize` rebuilds the whole object (through a chain
of deltas if its base was itself packed) and checks its hash before anyone links it.

The store never decides what to pack or drop: :class:`builders.cache.ArtifactCache` does,
with the entries' locks held.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import zstandard

DELTA_SUFFIX = ".zst"
DELTA_META = ".delta.json"
# Zstandard level and table sizes for deltas. Levels below 5 (fast strategies) barely use a
# large raw dictionary; level 6 with 2^24-entry tables found a relinked 100 MB library's
# shifted code in 2.7 s (delta 0.2 % of the file) on this 2-core machine.
DELTA_LEVEL = 6
DELTA_TABLE_LOG = 24


class ObjectStore:
    """Files named by their SHA-256 under ``root``; each kept whole, as a delta, or both."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def full(self, sha: str) -> Path:
        """Where the whole object ``sha`` lives (it may not exist)."""
        return self.root / sha[:2] / sha

    def _delta(self, sha: str) -> Path:
        return self.root / sha[:2] / f"{sha}{DELTA_SUFFIX}"

    def _meta(self, sha: str) -> Path:
        return self.root / sha[:2] / f"{sha}{DELTA_META}"

    def add(self, source: Path) -> str:
        """Store a copy of ``source`` (if not stored yet); its SHA-256."""
        sha = sha256_file(source)
        obj = self.full(sha)
        # a damaged object (truncated through one of its links) is replaced, not trusted
        if not obj.exists() or obj.stat().st_size != source.stat().st_size:
            obj.parent.mkdir(parents=True, exist_ok=True)
            tmp = obj.with_name(f"{sha}.tmp{os.getpid()}")
            shutil.copy2(source, tmp)
            os.replace(tmp, obj)
        return sha

    def base_of(self, sha: str) -> str | None:
        """The base object of ``sha``'s delta, or None when it has none."""
        try:
            return json.loads(self._meta(sha).read_text())["base"]
        except FileNotFoundError:
            return None

    def deltas(self) -> dict[str, str]:
        """{object: its base} for every stored delta."""
        found = {}
        for meta in self.root.glob(f"*/*{DELTA_META}"):
            found[meta.name.removesuffix(DELTA_META)] = json.loads(meta.read_text())["base"]
        return found

    def make_delta(self, sha: str, base: str, max_ratio: float = 0.5) -> bool:
        """Keep the whole object ``sha`` also as a delta against ``base`` (both whole now).

        Returns False, writing nothing, when the delta would be larger than ``max_ratio`` of
        the object (the files are not alike). The delta is decompressed and its hash checked
        before it counts, so a packed object can always be rebuilt.
        """
        if self.base_of(sha) == base:
            return True
        # Both are whole now, so their old deltas can go: a new one for ``sha``, and none for
        # ``base`` (whose delta could lead back to ``sha`` and make a cycle no one can rebuild).
        self.drop_delta(sha)
        self.drop_delta(base)
        data, reference = self.full(sha).read_bytes(), self.full(base).read_bytes()
        window_log = _window_log(len(data), len(reference))
        params = zstandard.ZstdCompressionParameters.from_level(
            DELTA_LEVEL, source_size=len(data), window_log=window_log,
            hash_log=min(window_log - 1, DELTA_TABLE_LOG), chain_log=min(window_log - 1, DELTA_TABLE_LOG))
        dictionary = zstandard.ZstdCompressionDict(reference, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        dictionary.precompute_compress(compression_params=params)
        delta = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params).compress(data)
        if len(delta) > max_ratio * len(data):
            return False
        if hashlib.sha256(_apply(delta, reference, window_log)).hexdigest() != sha:
            raise RuntimeError(f"delta of object {sha[:12]} against {base[:12]} does not round-trip")
        _write_atomic(self._delta(sha), delta)
        _write_atomic(self._meta(sha), json.dumps({"base": base, "window_log": window_log,
                                                   "size": len(data)}).encode())
        return True

    def drop_delta(self, sha: str) -> None:
        """Forget ``sha``'s delta (only while ``sha`` is whole; its meta file goes first)."""
        if self.base_of(sha) is not None and not self.full(sha).exists():
            raise RuntimeError(f"object {sha[:12]} is packed: its delta cannot be dropped")
        self._meta(sha).unlink(missing_ok=True)
        self._delta(sha).unlink(missing_ok=True)

    def materialize(self, sha: str) -> Path:
        """The whole object ``sha``, rebuilt from its delta chain if it is packed.

        Only ``sha`` is written; the objects along its chain are rebuilt in memory and stay
        packed.
        """
        obj = self.full(sha)
        if not obj.exists():
            _write_atomic(obj, self._rebuild(sha))
        return obj

    def _rebuild(self, sha: str) -> bytes:
        obj = self.full(sha)
        if obj.exists():
            return obj.read_bytes()
        meta_path = self._meta(sha)
        if not meta_path.exists():
            raise FileNotFoundError(f"object {sha[:12]} is neither stored whole nor as a delta")
        meta = json.loads(meta_path.read_text())
        reference = self._rebuild(meta["base"])
        try:
            data = _apply(self._delta(sha).read_bytes(), reference, meta["window_log"])
        except zstandard.ZstdError as exc:
            raise RuntimeError(f"object {sha[:12]} cannot be rebuilt from its delta: {exc}") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError(f"object {sha[:12]} rebuilt from its delta has the wrong hash")
        return data

    def chain_length(self, sha: str) -> int:
        """How many deltas must be applied to rebuild ``sha`` (0 when it is whole)."""
        length = 0
        while not self.full(sha).exists():
            base = self.base_of(sha)
            if base is None:
                break
            sha, length = base, length + 1
        return length

    def collect(self, needed: set[str]) -> None:
        """Delete what no one needs: ``needed`` are objects entries list (linked or packed).

        A whole object stays while something links it or while it is needed and has no
        delta; a delta stays while its object is needed. The bases of needed deltas are
        needed in turn.
        """
        deltas = self.deltas()
        needed, todo = set(needed), list(needed)
        while todo:
            base = deltas.get(todo.pop())
            if base is not None and base not in needed:
                needed.add(base)
                todo.append(base)
        for path in self.root.glob("*/*"):
            name = path.name
            if name.endswith((DELTA_SUFFIX, DELTA_META)):
                sha = name.removesuffix(DELTA_SUFFIX).removesuffix(DELTA_META)
                if sha not in needed:
                    path.unlink(missing_ok=True)
            elif ".tmp" not in name and path.stat().st_nlink == 1 and (name not in needed or name in deltas):
                path.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _window_log(size: int, reference: int) -> int:
    # The window must reach from the end of the new data back to the start of the dictionary.
    return max(20, min(31, (size + reference).bit_length()))


def _apply(delta: bytes, reference: bytes, window_log: int) -> bytes:
    dictionary = zstandard.ZstdCompressionDict(reference, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdDecompressor(dict_data=dictionary, max_window_size=1 << window_log).decompress(delta)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
