"""The builder plug-in interface and its registry."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from abwatch.builders.cache import ArtifactCache
from abwatch.service.repo import CommitInfo


@dataclass(frozen=True)
class Artifact:
    """A completed build: the directory runners use, and how it came to be."""

    key: str
    path: Path
    cached: bool
    log: str
    duration_s: float
    metrics: dict = field(default_factory=dict)  # e.g. incremental, steps, ccache hit rate


class BuildFailed(Exception):
    """The build command failed; ``log`` holds what it printed."""

    def __init__(self, message: str, log: str, duration_s: float) -> None:
        super().__init__(message)
        self.log = log
        self.duration_s = duration_s


class Builder(abc.ABC):
    """Turns a ref into an :class:`Artifact`, building each cache key at most once.

    Subclasses take the whole :class:`~service.config.Config` and set ``repository_url``
    (what the database calls the repository: a git URL, or ``pypi:apache-tvm``).
    """

    kind: ClassVar[str]
    repository_url: str

    @abc.abstractmethod
    def resolve(self, ref: str) -> CommitInfo:
        """What ``ref`` names (a commit, or a release); an error naming the ref if nothing."""

    @abc.abstractmethod
    def config_hash(self) -> str:
        """Hash of the build configuration (part of every cache key)."""

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
        the one that waited finds the entry the other stored.
        """
        key = self.cache_key(sha)
        with self.cache.lock(key):
            hit = self.cache.get(key)
            if hit is not None:
                return Artifact(key=key, path=hit, cached=True, log="", duration_s=0.0)
            return self.produce(sha, key)
