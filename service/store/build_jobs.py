"""Build jobs: one job per artifact (commit, build configuration, toolchain) in the ``jobs`` table,
apart from the measure jobs of the devices that need it.

A build job's device is :data:`BUILD_QUEUE`, the queue ``abwatch worker --builds`` takes from
(any number of build hosts, each claiming with ``FOR UPDATE SKIP LOCKED`` and holding the job's
advisory lock, as a device's worker does). A host that needs an artifact nobody has stored
either waits for the build job (a build host has it, or one is alive to take it) or claims it
itself (:func:`claim`) and builds, so each artifact is built once across hosts; with no build
host at all every host builds what it needs, as a single host always did. A build host killed
mid-build drops its lock: :func:`requeue_dead` (or the next build worker's reap) puts the job
back and another host takes it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from datetime import UTC, timedelta

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from abwatch.service.store import locks
from abwatch.service.store.devices import DeviceHost
from abwatch.service.store.jobs import Job, JobStatus
from abwatch.service.store.locks import JOB_LOCK
from abwatch.service.store.rows import insert_ignoring_conflict
from abwatch.service.store.base import utcnow

BUILD_QUEUE = "@builds"  # the jobs' device: no device name begins with @ (a runner names hosts and boards)
KIND = "build"


def dedupe_key(artifact_key: str) -> str:
    """The one build job of an artifact."""
    return f"{KIND}:{artifact_key}"


def enqueue(session: Session, sha: str, artifact_key: str) -> None:
    """Queue the build of ``artifact_key`` (commit ``sha``) unless it is queued or was built
    already (in the session's transaction)."""
    insert_ignoring_conflict(session, Job, {
        "kind": KIND, "device": BUILD_QUEUE, "payload": {"sha": sha, "key": artifact_key},
        "dedupe_key": dedupe_key(artifact_key), "status": JobStatus.QUEUED, "attempts": 0,
        "created_at": utcnow()}, ["dedupe_key"])


def status(session: Session, artifact_key: str) -> tuple[int, JobStatus] | None:
    """(id, status) of the artifact's build job, read fresh; None when it has none."""
    row = session.execute(select(Job.id, Job.status).where(Job.dedupe_key == dedupe_key(artifact_key))).first()
    return (row[0], JobStatus(row[1])) if row is not None else None


def build_hosts_alive(session: Session, within_s: float) -> bool:
    """Whether a build host (``abwatch worker --builds``) beat its heartbeat within ``within_s``."""
    row = session.execute(select(DeviceHost.heartbeat_at, DeviceHost.stopped_at)
                          .where(DeviceHost.name == BUILD_QUEUE)).first()
    if row is None or row[1] is not None or row[0] is None:
        return False
    beat = row[0] if row[0].tzinfo is not None else row[0].replace(tzinfo=UTC)
    return utcnow() - beat < timedelta(seconds=within_s)


@dataclass
class Claim:
    """A build job this process claimed: its lock is held on ``connection`` until :meth:`finish`."""

    engine: Engine
    job_id: int
    connection: Connection

    def finish(self, state: JobStatus, result: dict | None = None, error: str | None = None) -> None:
        """Record how the build went (``queued`` puts it back for another host) and drop the lock."""
        try:
            with Session(self.engine) as session:
                job = session.get_one(Job, self.job_id)
                job.status, job.result, job.error = state, result, error
                job.finished_at = None if state is JobStatus.QUEUED else utcnow()
                session.commit()
        finally:
            _release(self.connection, self.job_id)


def _release(connection: Connection, job_id: int) -> None:
    """Drop the build job's lock and give the connection back. A session-level advisory lock
    outlives ``close()`` (the connection goes back to the engine's pool with the lock held, and
    the job could never be claimed by another host while this process lives), so it is
    unlocked first; a connection that cannot say so is discarded, and the lock with it."""
    try:
        locks.unlock(connection, JOB_LOCK, job_id)
    except DBAPIError:
        with contextlib.suppress(DBAPIError):
            connection.invalidate()
    with contextlib.suppress(DBAPIError):
        connection.close()


def claim(engine: Engine, artifact_key: str) -> Claim | None:
    """Take the queued build job of ``artifact_key`` (PostgreSQL); None when another host has it."""
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    locked: int | None = None
    try:
        locks.label(connection, f"abwatch build {socket.gethostname()}:{os.getpid()}")
        with Session(engine) as session:
            job = session.scalar(select(Job).where(Job.dedupe_key == dedupe_key(artifact_key),
                                                   Job.status == JobStatus.QUEUED).with_for_update(skip_locked=True))
            if job is None or not locks.try_lock(connection, JOB_LOCK, job.id):
                connection.close()
                return None
            locked = job.id
            job.status, job.worker, job.claimed_at = JobStatus.RUNNING, f"{socket.gethostname()}:{os.getpid()}", utcnow()
            job.attempts += 1
            session.commit()
            return Claim(engine, job.id, connection)
    except BaseException:
        if locked is None:
            connection.close()
        else:
            _release(connection, locked)
        raise


def requeue_dead(engine: Engine, job_id: int) -> bool:
    """Put the ``running`` build job ``job_id`` back in the queue if its worker is gone (its lock
    free); whether it was."""
    with engine.connect() as connection, Session(engine) as session:
        job = session.scalar(select(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING)
                             .with_for_update(skip_locked=True))
        if job is None or not locks.try_lock(connection, JOB_LOCK, job_id):
            return False
        try:
            job.status, job.error = JobStatus.QUEUED, f"build host {job.worker} died; queued again"
            session.commit()
        finally:
            locks.unlock(connection, JOB_LOCK, job_id)
            connection.commit()
        return True
