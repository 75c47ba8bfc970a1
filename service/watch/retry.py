"""Commits the machine failed stay untested, and the next pass of the watch tries them again.

A full disk, a build tool that is not installed or a lost database
(:func:`service.compare.infra.infrastructure`) say nothing about the commit: its
``watched_commits`` row stays ``queued`` (with the reason), no GitHub ``error`` status blames
it (a ``pending`` one says why it waits), its job ends ``failed`` with an error that begins
with :data:`~service.compare.infra.PREFIX`, and :func:`requeue`, called by every pass
before it looks for new commits, puts that job back in the queue: the commit is tested once
the machine is fixed, in its place in the branch's order (jobs are claimed in id order).
"""

from __future__ import annotations

import sys

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from abwatch.core.commit_info import storable
from abwatch.service.compare import infra
from abwatch.service.config import Config
from abwatch.service.notify import github
from abwatch.service.store import db
from abwatch.service.store.models import Commit, CommitStatus, Job, JobStatus, WatchedCommit, WatchProgress


class Untested(Exception):
    """A job's commit was left untested by an infrastructure failure (its message says which)."""


def untested(session: Session, config: Config, job: Job, sha: str, exc: BaseException) -> Untested | None:
    """If ``exc`` is an infrastructure failure, the error to end the job with (the commit stays
    ``queued``, a ``pending`` status says why); None when it is the commit's or a bug's.

    Called after the job's transaction was rolled back. With the database gone nothing is
    written: the worker's reconnect and :func:`service.watch.queue.reap` take the job up again.
    """
    why = infra.infrastructure(exc)
    if why is None:
        return None
    text = storable(f"{infra.PREFIX}, {sha[:12]} not tested yet (the next pass retries it): {why}", 2000)
    if db.lost_connection(exc) is None:
        try:
            watched = session.scalars(select(WatchedCommit).join(Commit, Commit.id == WatchedCommit.commit_id)
                                      .where(WatchedCommit.progress_id == job.payload["progress_id"],
                                             Commit.sha == sha)).one_or_none()
            if watched is not None:
                watched.reason = text
            github.enqueue(session, config.github, sha, "pending", job.device, f"not tested yet: {why}")
            session.commit()
        except SQLAlchemyError:  # the database's own disk is full: the commit stays `queued` all the same
            session.rollback()
    return Untested(text)


def requeue(session: Session, row: WatchProgress) -> list[str]:
    """Queue again the failed ``test`` jobs of ``row`` whose commit is still ``queued`` (only an
    infrastructure failure leaves one so); a message for each."""
    keys = {f"test:{row.id}:{sha}": sha for sha in session.scalars(
        select(Commit.sha).join(WatchedCommit, WatchedCommit.commit_id == Commit.id)
        .where(WatchedCommit.progress_id == row.id, WatchedCommit.status == CommitStatus.QUEUED))}
    if not keys:
        return []
    messages = []
    for job in session.scalars(select(Job).where(Job.dedupe_key.in_(list(keys)), Job.status == JobStatus.FAILED)
                               .order_by(Job.id)):
        messages.append(f"{keys[job.dedupe_key][:12]} on {job.device}: queued again after {job.error}")
        print(f"abwatch watch: {messages[-1]}", file=sys.stderr)
        job.status, job.error, job.finished_at = JobStatus.QUEUED, None, None
    session.flush()
    return messages
