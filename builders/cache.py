"""The artifact cache: one directory per build key, usable only once its marker exists.

Layout (after asv): ``{root}/{key}/`` holds the artifact, ``{root}/{key}/.abwatch-complete``
is written last, so a crash mid-copy leaves an entry that is never used (and is replaced
by the next build). Entries are filled under an exclusive ``flock`` on ``{root}/{key}.lock``,
so two builders of one key on this machine wait for each other instead of building twice.

``put_deduplicated`` stores files by content in ``{root}/.objects/`` and hard-links them
into the entry, so artifacts of neighbouring commits share every unchanged file (ten
Python-only commits keep one copy of a large library). A library that a commit relinked is
new content, though; ``pack`` keeps such files of older entries of one build configuration
as binary deltas against the newest entry's (see :mod:`builders.objects`), and ``hold`` (or
``get``) rebuilds them when an older entry is used. ``hold`` also keeps an entry from being
packed or evicted while a comparison runs from it. Using an entry touches its marker;
``evict`` removes the least recently used entries until the cache fits its limit, and
``make_room`` (before every build: ``[cache] max_gb`` and ``min_free_gb``) until it also
leaves that much of its file system free.

Every entry keeps the size and modification time of each file as it was stored
(``MANIFEST``); ``get`` checks them before an entry is used (a stat per file), and an entry
that no longer matches (a truncated binary, a file gone) is discarded, so the builder builds
it again and says so (``healed``). ``damage(key, full=True)`` also checks a deduplicated
entry's files against their content hashes (``abwatch cache --verify``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Iterator

from abwatch.core.file_lock import flocked
from abwatch.builders.objects import ObjectStore, sha256_file
from abwatch.builders.safe_copy import MODE_BITS, LinkRule, copy_tree, link_stays_inside

MARKER = ".abwatch-complete"
OBJECTS = ".abwatch-objects.json"  # {relative path: sha256} of a deduplicated entry
MANIFEST = ".abwatch-manifest.json"  # {relative path: [size, mtime_ns]} of every file, as stored
BOOKKEEPING = frozenset({MARKER, f"{MARKER}.tmp", OBJECTS, MANIFEST})
DELTA_MIN_BYTES = 1 << 20  # smaller files are not worth a delta
MAX_CHAIN = 16  # longest chain of deltas a rebuild may apply (measured: ~0.5 s per delta of a 78 MB library)


@dataclass(frozen=True)
class EntryInfo:
    """One complete cache entry as ``abwatch cache`` lists it."""

    key: str
    sha: str | None
    builder: str | None
    series: str | None
    stored_at: str | None
    last_used: str
    files: int  # files stored by content (0 for copied entries and venvs)
    packed_files: int  # of those, how many are kept as deltas right now
    check: str | None = None  # with verify: "ok", "damaged: <what>", or "unverified" (no manifest)


class ArtifactCache:
    """A directory of completed build artifacts keyed by a content hash."""

    def __init__(self, root: Path, delta_min_bytes: int = DELTA_MIN_BYTES, max_chain: int = MAX_CHAIN) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.objects = ObjectStore(self.root / ".objects")
        self.delta_min_bytes = delta_min_bytes
        self.max_chain = max_chain
        self.healed: dict[str, str] = {}  # key -> why its damaged entry was discarded (by get)

    def path(self, key: str) -> Path:
        """Where the artifact of ``key`` lives (complete or not)."""
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"invalid artifact key {key!r}")
        return self.root / key

    def get(self, key: str) -> Path | None:
        """The artifact directory of ``key`` if it is complete, else None (a hit counts as a use).

        Packed files are rebuilt first. To keep them from being packed again while the
        artifact is in use, use :meth:`hold`.
        """
        path = self.path(key)
        marker = path / MARKER
        if not marker.is_file():
            return None
        os.utime(marker)  # least-recently-used eviction reads this
        try:
            self.materialize(key)
            reason = self.damage(key)
        except (OSError, ValueError) as exc:  # a delta or object it needs is gone or unreadable
            reason = f"cannot rebuild its packed files: {exc}"
        if reason is not None:
            self.healed[key] = reason
            self.discard(key)
            return None
        return path

    def damage(self, key: str, full: bool = False) -> str | None:
        """What is wrong with the complete entry ``key`` against what it was stored with, or None.

        Cheap by default: each file's size, and its modification time unless it is a
        deduplicated file (those are relinked when unpacked); ``full`` also hashes the
        deduplicated files against their stored content hashes. An entry stored before
        manifests were kept is taken as it is (:meth:`verifiable` tells).
        """
        entry, manifest, listing = self.path(key), self._manifest(key), self._listing(key)
        for rel, (size, mtime_ns) in sorted(manifest.items()):
            try:
                st = os.lstat(entry / rel)
            except FileNotFoundError:
                if rel in listing:
                    continue  # packed: kept as a delta until it is used
                return f"{rel} is missing"
            if st.st_size != size:
                return f"{rel} has {st.st_size} bytes, it was stored with {size}"
            if rel not in listing and st.st_mtime_ns != mtime_ns:
                return f"{rel} was modified after it was stored"
            if full and rel in listing and sha256_file(entry / rel) != listing[rel]:
                return f"{rel} does not match its content hash"
        return None

    def verifiable(self, key: str) -> bool:
        """Whether ``key`` was stored with a manifest (entries from before it are not checked)."""
        return (self.path(key) / MANIFEST).is_file()

    def discard(self, key: str) -> None:
        """Make ``key`` incomplete (marker first), then remove what is left of it."""
        entry = self.path(key)
        (entry / MARKER).unlink(missing_ok=True)
        shutil.rmtree(entry, ignore_errors=True)

    def lock(self, key: str):
        """Hold the exclusive lock of ``key`` (blocks while another process holds it)."""
        return flocked(self.root / f"{key}.lock")

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
        # mkdtemp made it 0700: code under test runs in it as the sandbox's own user
        os.chmod(staging, 0o755)
        os.rename(staging, final)
        self._mark(final, info)
        return final

    def link_object(self, sha: str, size: int, mode: int, target: Path) -> bool:
        """Hard-link the stored object ``sha`` at ``target`` if this cache holds it whole, with
        ``size`` bytes and permission bits ``mode``; whether it did (a fetch then skips it)."""
        with self._objects_lock():
            try:
                st = self.objects.full(sha).stat()
            except FileNotFoundError:
                return False
            if st.st_size != size or st.st_mode & 0o7777 != mode:
                return False  # a truncated object, or the same bytes with other permissions
            os.link(self.objects.full(sha), target)
            return True

    def adopt_deduplicated(self, key: str, staging: Path, listing: dict[str, str], info: dict) -> Path:
        """Adopt ``staging`` (see :meth:`adopt`) whose files in ``listing`` ({path: sha256}, each
        checked against its hash) become content-addressed objects, as :meth:`put_deduplicated`
        makes them: a file the store lacks is linked in as the object, one it has meanwhile is
        replaced by a link to it. Call with the key's lock held."""
        kept = {}
        with self._objects_lock():  # local work only: held once for the whole entry
            for rel, sha in listing.items():
                path, obj = staging / rel, self.objects.full(sha)
                own, st = path.stat(), obj.stat() if obj.exists() else None
                if st is None:
                    obj.parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, obj)
                elif (st.st_size, st.st_mode) != (own.st_size, own.st_mode):
                    continue  # kept as a file of its own, not deduplicated
                elif st.st_ino != own.st_ino:  # the same content, stored meanwhile: one copy
                    tmp = path.with_name(f"{path.name}.abwatch-link")
                    os.link(obj, tmp)
                    os.replace(tmp, path)
                kept[rel] = sha
        (staging / OBJECTS).write_text(json.dumps(kept, sort_keys=True))
        return self.adopt(key, staging, info)

    def put(self, key: str, source: Path, info: dict, said: list[str] | None = None) -> Path:
        """Copy ``source`` into the cache as ``key``; the marker (with ``info``) goes last.

        Call with the key's lock held. A stale incomplete entry is replaced. The copy follows no
        link (:func:`builders.safe_copy.copy_tree`: ``source`` itself a link is refused, a link
        out of it dropped); what it dropped is appended to ``said``.
        """
        final = self.path(key)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
        try:
            copy_tree(source, staging / "a", said=said)
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging / "a", final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._mark(final, info)
        return final

    def put_deduplicated(self, key: str, source: Path, info: dict, series: str | None = None,
                         allow_link: LinkRule | None = None, said: list[str] | None = None) -> Path:
        """Like :meth:`put`, but every regular file is a hard link to a content-addressed object.

        The entry's ``{path: sha256}`` list is kept in it (``OBJECTS``). With a ``series``
        (builds of one configuration), older entries of the series are then packed against
        this one: see :meth:`pack`. A link leading out of ``source`` is dropped unless
        ``allow_link`` admits it, and so is anything but files, directories and links (said in
        ``said``); setuid, setgid and sticky bits are cleared.
        """
        if os.path.islink(source):
            raise ValueError(f"{source} is a symbolic link: refused")
        staging = self.staging(key)
        try:
            listing = {}
            for dirpath, dirnames, filenames in os.walk(source):
                rel = Path(dirpath).relative_to(source)
                (staging / rel).mkdir(parents=True, exist_ok=True)
                links = [name for name in dirnames if os.path.islink(Path(dirpath) / name)]
                for name in sorted(filenames) + links:
                    src, dst = Path(dirpath) / name, staging / rel / name
                    st = os.lstat(src)
                    if stat.S_ISLNK(st.st_mode):
                        target = os.readlink(src)
                        if link_stays_inside(src, source) or (allow_link is not None
                                                              and allow_link(str(rel / name), target)):
                            os.symlink(target, dst)
                        elif said is not None:
                            said.append(f"note: dropped the symbolic link {rel / name} -> {target}: it leads "
                                        "outside the artifact\n")
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        if said is not None:
                            said.append(f"note: dropped {rel / name}: not a file, directory or link\n")
                        continue
                    if st.st_mode & ~MODE_BITS & 0o7777:
                        os.chmod(src, st.st_mode & MODE_BITS)
                    with self._objects_lock():
                        sha = self.objects.add(src)
                        os.link(self.objects.full(sha), dst)
                    listing[str(rel / name)] = sha
            (staging / OBJECTS).write_text(json.dumps(listing, sort_keys=True))
            path = self.adopt(key, staging, dict(info, series=series) if series else info)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if series:
            self.pack(key)
        return path

    def pack(self, newest: str) -> list[str]:
        """Keep the large files of the other entries of ``newest``'s series as deltas against it.

        A file of at least ``delta_min_bytes`` that differs from ``newest``'s file at the same
        path is stored as a Zstandard delta against it and unlinked from its entry; the entry
        stays complete and is rebuilt by :meth:`hold` (or :meth:`get`) when used. Entries in
        use are skipped, as are files unlike their counterpart and files whose delta chain
        would grow past ``max_chain``. Returns the keys of the entries packed.
        """
        series = self._info(newest).get("series") if (self.path(newest) / MARKER).is_file() else None
        if not series:
            return []
        newest_files = self._listing(newest)
        packed = []
        with self._objects_lock():
            heights = self._heights()
            for _, key in self.entries():
                if key == newest or self._info(key).get("series") != series:
                    continue
                with self._exclusive(f"{key}.use") as free:
                    if free and self._pack_entry(key, newest_files, heights):
                        packed.append(key)
            self.objects.collect(self._needed())
        return packed

    def _pack_entry(self, key: str, newest_files: dict[str, str], heights: dict[str, int]) -> bool:
        entry, changed = self.path(key), False
        for rel, sha in self._listing(key).items():
            base, linked = newest_files.get(rel), entry / rel
            if (base is None or base == sha or not linked.exists() or not self.objects.full(base).exists()
                    or linked.stat().st_size < self.delta_min_bytes):
                continue
            if heights.get(sha, 0) + 1 > self.max_chain:
                continue  # this one stays whole: it bounds how long a rebuild can take
            if self.objects.make_delta(sha, base):
                linked.unlink()
                heights[base] = max(heights.get(base, 0), heights.get(sha, 0) + 1)
                changed = True
        return changed

    def _heights(self) -> dict[str, int]:
        """{object: longest chain of deltas that ends in it} (0 or absent: none)."""
        dependents: dict[str, list[str]] = {}
        for sha, base in self.objects.deltas().items():
            dependents.setdefault(base, []).append(sha)
        heights: dict[str, int] = {}

        def height(sha: str) -> int:  # deltas never form a cycle (ObjectStore.make_delta)
            if sha not in heights:
                heights[sha] = max((height(d) + 1 for d in dependents.get(sha, ())), default=0)
            return heights[sha]

        for base in dependents:
            height(base)
        return heights

    def materialize(self, key: str) -> Path:
        """Rebuild and relink every packed file of ``key``; its directory, complete again."""
        entry = self.path(key)
        missing = {rel: sha for rel, sha in self._listing(key).items() if not (entry / rel).exists()}
        if missing:
            with self._objects_lock():
                for rel, sha in missing.items():
                    if not (entry / rel).exists():
                        os.link(self.objects.materialize(sha), entry / rel)
        return entry

    @contextmanager
    def hold(self, key: str) -> Iterator[Path]:
        """Use the complete entry ``key``: it is not packed or evicted until the block ends."""
        with flocked(self.root / f"{key}.use", fcntl.LOCK_SH):
            if self.get(key) is None:
                raise FileNotFoundError(f"artifact {key} is not in the cache")
            yield self.path(key)

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

    def describe(self, verify: bool = False) -> list[EntryInfo]:
        """What each complete entry is, least recently used first (for ``abwatch cache``);
        with ``verify``, each checked in full against what it was stored with (:meth:`damage`)."""
        described = []
        for used, key in self.entries():
            info, listing = self._info(key), self._listing(key)
            packed = sum(1 for rel in listing if not (self.path(key) / rel).exists())
            check = None
            if verify:
                reason = self.damage(key, full=True)
                check = f"damaged: {reason}" if reason else "ok" if self.verifiable(key) else "unverified"
            described.append(EntryInfo(key=key, sha=info.get("sha"), builder=info.get("builder"),
                                       series=info.get("series"), stored_at=info.get("stored_at"),
                                       last_used=datetime.fromtimestamp(used, UTC).isoformat(),
                                       files=len(listing) or self._count_files(key), packed_files=packed,
                                       check=check))
        return described

    def _count_files(self, key: str) -> int:
        """The regular files an entry holds that has no object listing (a venv stored whole):
        never 0 for hundreds of MiB."""
        return sum(1 for _, _, names, fd in os.fwalk(self.path(key)) for name in names
                   if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode))

    def evict(self, limit_bytes: int, keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Remove least recently used entries (never those in ``keep``) until within the limit.

        Entries being built or held by a running comparison are skipped rather than waited for.
        """
        return self._evict_until(lambda: self.size_bytes() <= limit_bytes, keep)

    def free_bytes(self) -> int:
        """Bytes free to this user on the cache's file system."""
        return shutil.disk_usage(self.root).free

    def make_room(self, max_bytes: int | None, min_free_bytes: int,
                  keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Evict least recently used entries (never those in ``keep``, nor any in use) until the
        cache is within ``max_bytes`` (None: no limit) and its file system has ``min_free_bytes``
        free; the keys removed. Done before each build, so the cache never fills the disk."""
        def fits() -> bool:
            return ((max_bytes is None or self.size_bytes() <= max_bytes)
                    and (min_free_bytes <= 0 or self.free_bytes() >= min_free_bytes))

        return self._evict_until(fits, keep)

    def _evict_until(self, fits, keep: frozenset[str] | set[str]) -> list[str]:
        removed: list[str] = []
        for _, key in self.entries():
            if fits():
                break
            if key in keep:
                continue
            with self._exclusive(f"{key}.lock") as free_build, self._exclusive(f"{key}.use") as free_use:
                if not (free_build and free_use):
                    continue
                shutil.rmtree(self.path(key), ignore_errors=True)
            removed.append(key)
            with self._objects_lock():
                self.objects.collect(self._needed())
        return removed

    def _manifest(self, key: str) -> dict[str, list[int]]:
        manifest = self.path(key) / MANIFEST
        return json.loads(manifest.read_text()) if manifest.is_file() else {}

    def _listing(self, key: str) -> dict[str, str]:
        listing = self.path(key) / OBJECTS
        return json.loads(listing.read_text()) if listing.is_file() else {}

    def _info(self, key: str) -> dict:
        return json.loads((self.path(key) / MARKER).read_text())

    def _needed(self) -> set[str]:
        """Every object a complete entry lists (whether linked now or packed)."""
        return {sha for _, key in self.entries() for sha in self._listing(key).values()}

    def _objects_lock(self):
        # One writer at a time for the object store: packing, rebuilding and collecting
        # must not see each other's half-done work.
        return flocked(self.root / ".objects.lock")

    def _exclusive(self, name: str):
        """Try the exclusive lock ``{root}/{name}`` without waiting; yields whether it was taken."""
        return flocked(self.root / name, fcntl.LOCK_EX | fcntl.LOCK_NB)

    @staticmethod
    def _mark(final: Path, info: dict) -> None:
        manifest = {}
        for dirpath, _, filenames in os.walk(final):
            for name in filenames:
                path = Path(dirpath) / name
                rel = str(path.relative_to(final))
                if rel not in BOOKKEEPING and not path.is_symlink():
                    st = path.stat()
                    manifest[rel] = [st.st_size, st.st_mtime_ns]
        (final / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
        stamp = dict(info, stored_at=datetime.now(UTC).isoformat())
        marker_tmp = final / f"{MARKER}.tmp"
        marker_tmp.write_text(json.dumps(stamp, sort_keys=True))
        os.replace(marker_tmp, final / MARKER)
