"""The job queue: a ``jobs`` table in the same database, claimed with ``FOR UPDATE SKIP LOCKED``.

Why not procrastinate or pgqueuer (see docs/internals.md): both need psycopg 3 or asyncpg
next to the psycopg2 abwatch ships, and neither runs on SQLite, where ``abwatch watch`` must
run the very same jobs in-process. A table with a unique ``dedupe_key`` and PostgreSQL's
row and advisory locks give what the watch needs and nothing more:

- a job is enqueued once (``dedupe_key`` is unique) and finishes once (``done``/``failed``);
- a worker claims jobs for its device only, in id order (per branch order matters);
- while it works, the worker holds two session-level advisory locks on a connection of its
  own: one for the device (so one benchmark per device at a time, whichever worker) and one
  for the job. A worker killed with ``kill -9`` loses its connection, PostgreSQL drops both
  locks, and :func:`reap` finds a ``running`` job whose lock is free: the job goes back to
  ``queued`` and the run it left is marked abandoned.

On SQLite the locks are not needed (one process does everything) and are skipped; the claim,
run and finish code is the same.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from datetime import datetime
from collections.abc import Iterator

import psutil
from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from abwatch.service.compare import liveness
from abwatch.service.store import db, locks
from abwatch.service.store.locks import DEVICE_LOCK, JOB_LOCK, lock_key as _key
from abwatch.service.store.models import Device, Job, JobStatus, Run, RunStatus, utcnow

def worker_name() -> str:
    """``host:pid`` of this process, stored on the jobs it claims."""
    return f"{socket.gethostname()}:{os.getpid()}"


def enqueue(session: Session, kind: str, device: str, payload: dict, dedupe_key: str) -> Job | None:
    """Add a job unless one with ``dedupe_key`` exists already; the new job, or None."""
    if session.scalar(select(Job.id).where(Job.dedupe_key == dedupe_key)) is not None:
        return None
    job = Job(kind=kind, device=device, payload=payload, dedupe_key=dedupe_key,
              status=JobStatus.QUEUED, attempts=0, created_at=utcnow())
    try:
        with session.begin_nested():
            session.add(job)
            session.flush()
    except IntegrityError:  # another process enqueued the same job a moment ago
        return None
    return job


class Worker:
    """Claims and runs the jobs of one device, one at a time.

    ``handlers`` maps a job kind to a function ``(session, job) -> dict`` whose result is
    stored on the job. The worker keeps one extra connection for its advisory locks.
    """

    def __init__(self, engine: Engine, device: str, handlers: dict[str, Callable[[Session, Job], dict]],
                 name: str | None = None, exclusive: bool = True) -> None:
        self.engine, self.device, self.handlers = engine, device, handlers
        # a device runs one job at a time, whichever worker; the build queue runs one per build host
        self.exclusive = exclusive
        self.name = name or worker_name()
        self.postgres = engine.dialect.name == "postgresql"
        self.factory = sessionmaker(engine, expire_on_commit=False)
        self.current: Job | None = None  # the job whose handler runs (a signal then interrupts it)
        self._locks: Connection | None = None  # opened when first needed, again after a reconnect

    def close(self) -> None:
        """Drop the lock connection (and with it any lock still held)."""
        if self._locks is not None:
            with contextlib.suppress(DBAPIError):  # the server dropped it already: its locks went with it
                self._locks.close()
            self._locks = None

    def reconnect(self) -> None:
        """Forget a lock connection the server dropped; the next job opens a new one."""
        self.close()
        self.engine.dispose()  # the pool's connections died with it too

    def _lock_connection(self) -> Connection:
        if self._locks is None:
            self._locks = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            locks.label(self._locks, f"abwatch worker {self.name}")  # a waiting compare names who holds it
        return self._locks

    def _try_lock(self, space: int, key: int) -> bool:
        if not self.postgres:
            return True
        return locks.try_lock(self._lock_connection(), space, key)

    def _unlock(self, space: int, key: int) -> None:
        if self.postgres and self._locks is not None:
            locks.unlock(self._locks, space, key)

    @contextmanager
    def _device(self) -> Iterator[bool]:
        if not self.exclusive:
            yield True
            return
        got = self._try_lock(DEVICE_LOCK, _key(self.device))
        try:
            # the driver's measuring lock (service.store.locks.device_lock) sees this process holds it
            with locks.held_here(self.device) if got else nullcontext():
                yield got
        finally:
            if got:
                self._unlock(DEVICE_LOCK, _key(self.device))

    def _claim(self) -> Job | None:
        """Take the oldest queued job of this device; its job lock is held before the claim commits."""
        with self.factory() as session:
            job = session.scalar(
                select(Job).where(Job.device == self.device, Job.status == JobStatus.QUEUED)
                .order_by(Job.id).limit(1).with_for_update(skip_locked=True))
            if job is None:
                return None
            if not self._try_lock(JOB_LOCK, job.id):  # a reaper is looking at it; try later
                return None
            job.status, job.worker, job.claimed_at = JobStatus.RUNNING, self.name, utcnow()
            job.attempts += 1
            session.commit()
            return job

    def run_one(self) -> Job | None:
        """Claim and run one job of this device; None when there is none (or the device is busy)."""
        reap(self.engine, self.device)
        with self._device() as free:
            if not free:
                return None
            job = self._claim()
            if job is None:
                return None
            try:
                self._run(job)
            finally:
                self._unlock(JOB_LOCK, job.id)
            return job

    def _handle(self, session: Session, job: Job) -> dict:
        """Run ``job``'s handler, which a signal meanwhile interrupts (:attr:`current`). Only
        the handler: a stop that comes while the outcome is written (a job already done, its
        session still closing) ends the worker's loop after it, never marks it interrupted."""
        self.current = job
        try:
            return self.handlers[job.kind](session, job)
        finally:
            self.current = None

    def _run(self, claimed: Job) -> None:
        with self.factory() as session:
            # the row exists: this worker claimed it and holds its lock
            job = session.get_one(Job, claimed.id)
            try:
                result = self._handle(session, job)
            except KeyboardInterrupt:  # SIGTERM or Ctrl-C: the job is not done; another worker takes it
                session.rollback()
                job = session.get_one(Job, claimed.id)
                job.status, job.error = JobStatus.QUEUED, f"worker {self.name} was stopped; queued again"
                session.commit()
                raise
            except Exception as exc:  # the job failed; the worker goes on with the next one
                if db.lost_connection(exc) is not None:
                    # nothing can be recorded now; once its lock is free, reap queues it again
                    raise
                session.rollback()
                job = session.get_one(Job, claimed.id)
                job.status, job.error = JobStatus.FAILED, f"{type(exc).__name__}: {exc}"
            else:
                job = session.get_one(Job, claimed.id)
                job.status, job.result = JobStatus.DONE, result
            job.finished_at = utcnow()
            session.commit()

    def drain(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Run this device's jobs until none is left (or ``stop()``); how many ran."""
        count = 0
        while not stop() and self.run_one() is not None:
            count += 1
        return count


def reap(engine: Engine, device: str | None = None) -> list[int]:
    """Put ``running`` jobs whose worker died back in the queue; mark their runs abandoned.

    On PostgreSQL a job is dead when its advisory lock is free. On SQLite (one process,
    nothing runs concurrently) every ``running`` job found here is left over from a process
    that was killed.
    """
    postgres = engine.dialect.name == "postgresql"
    requeued: list[int] = []
    with engine.connect() as held, Session(engine) as session:
        query = select(Job).where(Job.status == JobStatus.RUNNING).with_for_update(skip_locked=True)
        if device is not None:
            query = query.where(Job.device == device)
        for job in session.scalars(query):
            if postgres:
                if not locks.try_lock(held, JOB_LOCK, job.id):
                    continue  # its worker is alive
                locks.unlock(held, JOB_LOCK, job.id)
            elif _worker_alive(job.worker):
                continue  # SQLite: a second process on this host works the job (not supported, not broken)
            _abandon_runs(session, job)
            job.status, job.error = JobStatus.QUEUED, f"worker {job.worker} died; queued again"
            requeued.append(job.id)
        session.commit()
        held.rollback()
    if requeued:
        # regressions its verify run had moved to `verify` go back to `benchmark`, so the
        # job taken up again verifies them (service.compare.liveness knows which runs are dead)
        liveness.reap_quietly(engine)
    return requeued


def _worker_alive(worker: str | None) -> bool:
    """Whether ``host:pid`` names another living process on this host (SQLite's only check)."""
    host, _, pid = (worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    return psutil.pid_exists(int(pid))


def _abandon_runs(session: Session, job: Job) -> None:
    """The runs a dead worker left ``running`` on the job's device since it claimed the job."""
    status = getattr(RunStatus, "ABANDONED", RunStatus.FAILED)
    since: datetime = job.claimed_at or job.created_at
    session.execute(
        update(Run).where(Run.status == RunStatus.RUNNING, Run.started_at >= since,
                          Run.device_id.in_(select(Device.id).where(Device.name == job.device)))
        .values(status=status, finished_at=utcnow(),
                error=f"abandoned: worker {job.worker} died during job {job.id}"))
