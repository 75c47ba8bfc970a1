"""The builder plug-in interface and its registry."""

from __future__ import annotations

import abc
import errno
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, TypeVar

from abwatch.core.commit_info import CommitInfo
from abwatch.builders.artifact_store import ArtifactStore
from abwatch.builders.cache import ArtifactCache
from abwatch.builders.sizes import BinarySize, binary_size
from abwatch.builders.spec import BuildSettings, BuildSpec, CacheConfig

GB = 2**30
FULL_BYTES = 16 * 2**20  # a file system with less free than this is full, whatever cache.min_free_gb says
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


@dataclass(frozen=True)
class Artifact:
    """A completed build: the directory runners use, and how it came to be."""

    key: str
    path: Path
    cached: bool
    log: str
    duration_s: float
    metrics: dict = field(default_factory=dict)  # e.g. incremental, steps, ccache hit rate
    healed: str | None = None  # built again because the cached entry was damaged: what was wrong


@dataclass(frozen=True)
class SubmodulePin:
    """A submodule checked out at another commit than the one its parent commit records: how a
    bisection into a dependency bump builds TVM at one commit with ``3rdparty/tvm-ffi`` at each
    of the bump's own commits."""

    path: str
    sha: str

    @property
    def describe(self) -> str:
        """``path@sha``: what a build row and a build's log say of the pin."""
        return f"{self.path}@{self.sha}"


class BuildFailed(Exception):
    """The build command failed; ``log`` holds what it printed."""

    def __init__(self, message: str, log: str, duration_s: float) -> None:
        super().__init__(message)
        self.log = log
        self.duration_s = duration_s


class InfraFailure(Exception):
    """The machine failed the build, not the commit: a file system it writes to is full, or a
    build tool the config names is not installed. No build row blames the commit; it stays
    untested and is built again once the machine is fixed (the next pass of a watch)."""


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an error in its chain is one of abwatch's own writes (or its git's)
    that found no space: ``OSError`` ENOSPC/EDQUOT, ``shutil.copytree``'s collected errors, or
    git saying so. A build script's output is never read for this: it could say anything."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            return True
        if isinstance(exc, shutil.Error) and any(f"[Errno {code}]" in str(exc) for code in DISK_FULL):
            return True
        if type(exc).__name__ == "GitCommandError" and any(t in str(exc) for t in DISK_FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_space(directories: list[Path]) -> list[tuple[Path, int]]:
    """(directory, bytes free to this user) of each file system among ``directories`` (the first
    existing directory at or above each; one entry per file system)."""
    found, devices = [], set()
    for directory in directories:
        existing = next((d for d in (directory, *directory.parents) if d.is_dir()), None)
        if existing is None:
            continue
        usage, device = shutil.disk_usage(existing), existing.stat().st_dev
        if device not in devices:
            devices.add(device)
            found.append((directory, usage.free))
    return found


# Lines that say why a step failed (compilers, CMake, git, Python tracebacks, setuptools-scm)
_CAUSE = re.compile(r"(?<![\w/.-])(error|fatal|failed|cannot|unable to|no such file|not found|undefined reference|"
                    r"not our ref|did not contain)(?![\w/-])|\w+Error\b", re.IGNORECASE)
# pip's frame around a failed package build: says that it failed, never why
_FRAME = re.compile(r"^(error: subprocess-exited-with-error|error: metadata-generation-failed|ERROR: Failed to build|"
                    r"ERROR: Could not build|ERROR: Failed building|note: |hint: |[×╰│]|Failed to build\b|"
                    r"\*\*\* CMake build failed)")


def failure_lines(output: str, most: int = 6) -> list[str]:
    """The last lines of a failed step's ``output`` that say why (``most`` at most).

    Tools put the cause hundreds of lines above their last words (pip ends any failed
    package build with the same few lines), so the lines kept are those that name an error,
    each with the line after it when it ends in ``:`` (CMake writes the message there);
    with none of those, the last lines.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _CAUSE.search(line) and not _FRAME.match(line):
            picked.append(line)
            if line.endswith(":") and i + 1 < len(lines):
                picked.append(lines[i + 1])
    chosen = list(dict.fromkeys(picked))[-most:] or lines[-most:]
    return [line[:300] for line in chosen]


S = TypeVar("S", bound=BuildSpec)


def section(settings: BuildSettings, kind: type[S]) -> S:
    """``settings.build``, which a builder of ``kind``'s sections must have been given."""
    if not isinstance(settings.build, kind):
        raise TypeError(f"a {kind.__name__} builder was given a {type(settings.build).__name__}")
    return settings.build


def repo_url(settings: BuildSettings) -> str:
    """The repository a git-based builder builds from (the config's validation requires one)."""
    if settings.repo is None:
        raise TypeError(f"a {settings.build.kind} build needs [repo]")
    return settings.repo.url


class Builder(abc.ABC):
    """Turns a ref into an :class:`Artifact`, building each cache key at most once.

    Subclasses take the settings they build with (:class:`~builders.spec.BuildSettings`:
    the repository, their ``build`` section, the cache directory; the service's whole
    ``Config`` is one), keep their section as ``config`` and set ``repository_url`` (what
    the database calls the repository: a git URL, or ``pypi:apache-tvm``).
    """

    kind: ClassVar[str]
    repository_url: str
    config: BuildSpec

    @abc.abstractmethod
    def __init__(self, config: BuildSettings) -> None:
        """Take the settings (the registry calls every builder this way)."""

    @abc.abstractmethod
    def resolve(self, ref: str) -> CommitInfo:
        """What ``ref`` names (a commit, or a release); an error naming the ref if nothing."""

    def config_hash(self) -> str:
        """Hash of the build configuration (part of every cache key)."""
        return self.config.config_hash()

    @abc.abstractmethod
    def cache_key(self, sha: str) -> str:
        """The artifact cache key of ``sha`` under this builder's configuration."""

    cache: ArtifactCache
    limits: CacheConfig = CacheConfig()  # the config's [cache] (builders set it from their settings)
    # Whether an artifact of this builder works on another host once fetched into its cache (no
    # absolute path of the build host in it); only such builders use the shared store.
    shareable: ClassVar[bool] = False
    _shared_store: ArtifactStore | None = None

    @property
    def untrusted(self) -> bool:
        """Whether this builder builds code nobody merged (try and pull-request jobs: the build
        section's ``for_untrusted``). Its artifacts never reach what trusted builds use: it has
        no shared store and no remote compiler cache."""
        return bool(getattr(self.config, "untrusted", False))

    @property
    def store(self) -> ArtifactStore | None:
        """[artifacts] store: set by make_builder for shareable builders; never an untrusted one's."""
        return None if self.untrusted else self._shared_store

    @store.setter
    def store(self, value: ArtifactStore | None) -> None:
        if value is not None and self.untrusted:
            raise ValueError(f"a {self.kind} builder of untrusted code gets no shared artifact store")
        self._shared_store = value

    def portable(self, artifact: Path) -> bool:
        """Whether this built artifact (a cache entry) works on another host: pushed to the store
        only then. Every artifact of a shareable builder, unless the builder says otherwise."""
        return self.shareable

    def runs_here(self, artifact: Path) -> str | None:
        """Why an artifact fetched from the store cannot run on this host (its interpreter or
        libraries are not here), or None. Every artifact runs, unless the builder says otherwise."""
        return None

    def pin_submodule(self, sha: str, pin: SubmodulePin | None) -> None:
        """Build ``sha`` with ``pin``'s submodule at ``pin.sha`` from now on (None: as ``sha``
        records it). Only a builder that checks submodules out can; the others refuse."""
        raise TypeError(f"a {self.kind} builder does not check out submodules; it cannot pin {pin}")

    def submodule_pin(self, sha: str) -> SubmodulePin | None:
        """The submodule pinned for builds of ``sha`` (:meth:`pin_submodule`), or None."""
        return None

    @abc.abstractmethod
    def produce(self, sha: str, key: str) -> Artifact:
        """Build ``sha`` now and store it in the cache as ``key`` (called with the key locked)."""

    def build(self, sha: str) -> Artifact:
        """Return the artifact of ``sha``, from the cache or built now; raise BuildFailed.

        A key is built at most once: concurrent builders of one key wait on its lock, and
        the one that waited finds the entry the other stored. A cached entry that no longer
        matches what was stored is built again (``healed`` says what was wrong).

        Before building, least recently used entries are evicted until the cache is within
        ``cache.max_gb`` and its file system has ``cache.min_free_gb`` free; short of that,
        and when the build runs out of space or its tool is missing, :class:`InfraFailure`.
        """
        key = self.cache_key(sha)
        with self.cache.lock(key):
            hit = self.cache.get(key)
            if hit is not None:
                return Artifact(key=key, path=hit, cached=True, log="", duration_s=0.0)
            self.make_room(sha, keep={key})
            try:
                artifact = self.produce(sha, key)
            except (InfraFailure, KeyboardInterrupt):
                raise
            except Exception as exc:
                short = self.short_of_space()  # a persistent workspace still holds what filled the disk
                if disk_full(exc) or (short and isinstance(exc, BuildFailed)):
                    raise InfraFailure(f"build of {sha[:12]} ran out of disk space ({short or exc}); "
                                       "not the commit's failure: it stays untested") from exc
                raise
            limit = self.cache_limit_bytes()
            if limit is not None:
                self.cache.evict(limit, keep={key})
            damage = self.cache.healed.pop(key, None)  # get() found the entry damaged and dropped it
            return replace(artifact, healed=damage) if damage else artifact

    def binary_files(self, path: Path) -> list[Path]:
        """The files of the artifact at ``path`` whose sizes are the build's ``binary_size`` (its
        libraries); none unless the builder knows them."""
        return []

    def binary_size(self, path: Path) -> BinarySize | None:
        """The sizes of the artifact's :meth:`binary_files`; None where it names none."""
        return binary_size(path, self.binary_files(path))

    def cache_limit_bytes(self) -> int | None:
        """The artifact cache's size limit (``cache.max_gb``), None for none."""
        return None if self.limits.max_gb is None else int(self.limits.max_gb * GB)

    def scratch_dirs(self) -> list[Path]:
        """The directories a build writes to, whose file systems must keep ``cache.min_free_gb`` free."""
        return [self.cache.root, Path(tempfile.gettempdir())]

    def short_of_space(self, floor_bytes: int | None = None) -> str | None:
        """Which file system a build writes to has less than ``floor_bytes`` free now (default:
        ``cache.min_free_gb``, at least 16 MiB), with the figures; None when all have room."""
        return short_of_space(self.scratch_dirs(), self.limits, floor_bytes)

    def make_room(self, sha: str, keep: set[str]) -> None:
        """Evict least recently used artifacts to ``cache.max_gb`` and ``cache.min_free_gb``;
        :class:`InfraFailure` naming the directory and the figures if the floor still is not met."""
        floor = int(self.limits.min_free_gb * GB)
        evicted = self.cache.make_room(self.cache_limit_bytes(), floor, keep)
        short = self.short_of_space(floor)
        if short:
            raise InfraFailure(f"not enough free disk space to build {sha[:12]}: {short}"
                               f"{f' after evicting {len(evicted)} cached build(s)' if evicted else ''}; "
                               "free some space or lower cache.min_free_gb")

    def failed(self, message: str, log: str, duration_s: float) -> BuildFailed | InfraFailure:
        """The error of a build step that failed: :class:`InfraFailure` when a file system the
        build writes to is full right now (checked before its checkout is removed), else
        :class:`BuildFailed`, the commit's."""
        short = self.short_of_space()
        if short is not None:
            return InfraFailure(f"{message}, out of disk space: {short}; not the commit's failure, it stays untested")
        return BuildFailed(message, log, duration_s)


def short_of_space(directories: list[Path], limits: CacheConfig, floor_bytes: int | None = None) -> str | None:
    """Which of ``directories``' file systems has less than ``floor_bytes`` free now (default:
    ``limits.min_free_gb``, at least 16 MiB), with the figures; None when all have room."""
    floor = max(FULL_BYTES, int(limits.min_free_gb * GB)) if floor_bytes is None else floor_bytes
    for directory, free in free_space(directories):
        if free < floor:
            return f"{directory} has {free / GB:.3f} GB free, below cache.min_free_gb = {limits.min_free_gb:g} GB"
    return None


def missing_tool(argv0: str, exc: OSError) -> bool:
    """Whether starting ``argv0`` failed because a build tool named by the config (a bare
    command name, looked up on PATH) is not installed; a path (``./build.sh``) is the commit's."""
    return exc.errno == errno.ENOENT and "/" not in argv0
