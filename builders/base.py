"""The builder plug-in interface and its registry."""

from __future__ import annotations

import abc
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
