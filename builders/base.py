"""The builder plug-in interface and its registry."""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, TypeVar

from abwatch.builders.cache import ArtifactCache
from abwatch.builders.spec import BuildSettings, BuildSpec, CommitInfo


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


class BuildFailed(Exception):
    """The build command failed; ``log`` holds what it printed."""

    def __init__(self, message: str, log: str, duration_s: float) -> None:
        super().__init__(message)
        self.log = log
        self.duration_s = duration_s


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

    @abc.abstractmethod
    def produce(self, sha: str, key: str) -> Artifact:
        """Build ``sha`` now and store it in the cache as ``key`` (called with the key locked)."""

    def build(self, sha: str) -> Artifact:
        """Return the artifact of ``sha``, from the cache or built now; raise BuildFailed.

        A key is built at most once: concurrent builders of one key wait on its lock, and
        the one that waited finds the entry the other stored. A cached entry that no longer
        matches what was stored is built again (``healed`` says what was wrong).
        """
        key = self.cache_key(sha)
        with self.cache.lock(key):
            hit = self.cache.get(key)
            if hit is not None:
                return Artifact(key=key, path=hit, cached=True, log="", duration_s=0.0)
            artifact = self.produce(sha, key)
            damage = self.cache.healed.pop(key, None)  # get() found the entry damaged and dropped it
            return replace(artifact, healed=damage) if damage else artifact
