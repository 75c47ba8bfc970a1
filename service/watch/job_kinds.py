"""The kinds of job of the worker queue (:mod:`.queue`), registered by name in :data:`JOB_KINDS`
(as builders are in ``BUILDERS``): what a worker does with a job it claimed, by the job's ``kind``.

- ``test``: the watch's (:func:`.poll.test_commit`), one commit against its control;
- ``try``: a person's (:func:`.tryjob.run_try`);
- ``pr``: a pull request's (:func:`.pulls.run_pr`);
- ``build``: a build host's (:func:`.builds.run_build`), on the build queue (``@builds``), not a device's.

A new kind of job is a :class:`JobKind` subclass and its line in :data:`JOB_KINDS`; what enqueues
it (``queue.enqueue(session, kind, ...)``) names it. A job's kind is a plain string column
(``jobs.kind``), so no migration is needed.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import ClassVar

from sqlalchemy.orm import Session

from abwatch.core.plugins import Registry
from abwatch.service.compare.progress import Progress
from abwatch.service.config import Config
from abwatch.service.store.models import Job
from abwatch.service.watch import builds, pulls, tryjob, poll as watch


class JobKind(abc.ABC):
    """One kind of job: how a worker runs a claimed job of it (its result is stored on the job;
    an exception fails the job, and the worker goes on with the next one)."""

    # run by the build hosts' worker (``abwatch worker --builds``, the queue ``@builds``) rather
    # than by a device's: a device's worker must never claim a build, nor a build host a benchmark
    of_builds: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, session: Session, config: Config, job: Job, progress: Progress | None) -> dict:
        """Carry out ``job`` with ``config``; what is stored as its result."""


class WatchTest(JobKind):
    """``test``: the watch's comparison of one commit with its control, escalated."""

    def run(self, session: Session, config: Config, job: Job, progress: Progress | None) -> dict:
        return watch.test_commit(session, config, job, progress)


class TryJob(JobKind):
    """``try``: a person's comparison, verified when asked."""

    def run(self, session: Session, config: Config, job: Job, progress: Progress | None) -> dict:
        return tryjob.run_try(session, config, job, progress)


class PullJob(JobKind):
    """``pr``: a pull request's comparison, its answer left in the outbox."""

    def run(self, session: Session, config: Config, job: Job, progress: Progress | None) -> dict:
        return pulls.run_pr(session, config, job, progress)


class BuildJob(JobKind):
    """``build``: one commit built (or found in the artifact store) and pushed."""

    of_builds = True

    def run(self, session: Session, config: Config, job: Job, progress: Progress | None) -> dict:
        return builds.run_build(session, config, job, progress)


# kind -> how it runs: the one place a kind of job is registered
JOB_KINDS: Registry[JobKind] = Registry("job kind", (
    ("test", WatchTest()), (tryjob.KIND, TryJob()), (pulls.KIND, PullJob()), (builds.KIND, BuildJob())))


def handlers(config: Config, progress: Progress | None = None, *,
             of_builds: bool = False) -> dict[str, Callable[[Session, Job], dict]]:
    """What a :class:`.queue.Worker` runs each kind by (kind -> ``(session, job) -> result``): the
    device's kinds, or with ``of_builds`` the build queue's; read when called, so a kind
    registered later counts."""
    return {name: functools.partial(_run, kind, config, progress)
            for name, kind in JOB_KINDS.items() if kind.of_builds == of_builds}


def _run(kind: JobKind, config: Config, progress: Progress | None, session: Session, job: Job) -> dict:
    return kind.run(session, config, job, progress)
