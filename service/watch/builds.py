"""Build hosts: ``abwatch worker --builds`` takes build jobs (:mod:`service.store.build_jobs`), builds
each commit once and pushes its artifact to the shared store, where device hosts fetch it.

Any number of build hosts share the queue: each claims a job with ``FOR UPDATE SKIP LOCKED`` and
holds its advisory lock while it builds (:class:`service.watch.queue.Worker`, without a device's
lock: builds of different commits run at once on different hosts). A build host killed
mid-build drops its lock; the next claim of any build host (its ``reap``), or a device host
waiting for the artifact, puts the job back in the queue and another host builds it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from abwatch.builders import make_builder
from abwatch.service.compare import building
from abwatch.service.compare.progress import NullProgress, Progress
from abwatch.service.config import Config, ConfigError
from abwatch.service.store.build_jobs import BUILD_QUEUE, KIND
from abwatch.service.store.models import Job

__all__ = ["BUILD_QUEUE", "KIND", "check", "run_build"]


def check(config: Config) -> None:
    """A build host needs a store to push to and a builder whose artifacts other hosts can use."""
    if not config.artifacts.store:
        raise ConfigError(f"{config.at('artifacts.store')}: a build host (worker --builds) needs [artifacts] store, "
                          "where device hosts fetch what it builds")
    if not make_builder(config).shareable:
        raise ConfigError(f"{config.at('build.kind')}: {config.build.kind} artifacts are not shared between hosts "
                          "(they hold paths of the host that built them): each device host builds its own")


def run_build(session: Session, config: Config, job: Job, progress: Progress | None = None) -> dict:
    """The ``build`` job: build one commit (or find it in the store), push it, record its manifest."""
    progress = progress or NullProgress()
    builder = make_builder(config)
    sha, key = job.payload["sha"], job.payload["key"]
    mine = builder.cache_key(sha)
    if mine != key:  # another toolchain: what this host builds is another artifact than the one asked for
        raise RuntimeError(f"this build host's toolchain makes {mine} of {sha[:12]}, the job asks for {key}: "
                           "build hosts and device hosts need the same toolchain (docs/fleet.md)")
    [outcome] = building.build_commits(session, builder, [sha], progress, claimed=True)
    return {"sha": sha, "status": outcome.status, "artifact_key": key, "build_id": outcome.build_id,
            "cached": outcome.cached}
