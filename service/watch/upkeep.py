"""What a pass of the watch looks after besides new commits: escalations left unfinished, and
confirmed regressions whose culprit a force-push took off the branch.

**Unfinished escalations.** A ``test`` job verifies and bisects what its comparison found. A job
that failed part-way (an error, not a verdict), or whose bisection was off or ran out of its
build budget, leaves a regression in ``benchmark`` (not verified) or ``regress`` without a
culprit, and no later job of the branch would look at it again: a commit that once stopped a
bisection would hide its culprit for good. Each pass queues such a commit's ``test`` job again
(:func:`resume_unfinished`); the job goes on from the stored rows (the comparison is not redone,
bisection steps already judged are reused), at most :data:`RESUMES` times a commit, so an
escalation that fails the same way every time is said a few times, not every pass forever.

**Departed culprits.** After a force-push a regression's culprit may no longer be on the
branch. Such a regression is closed as ``cleared`` with the reason (:func:`clear_departed`),
not kept open: no commit of the branch holds that slowdown any more, so nothing on the branch
could ever fix it, and if the rewritten history brings the slowdown back (the same change
rebased, under a new sha) the watch tests the new commits against the last tested commit still on
the branch and finds, verifies and bisects it again, naming the commit that is on the branch.
Its history (verdicts, steps, culprit, alerts) is kept; the ``cleared`` event says why.
"""

from __future__ import annotations

import sys

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from abwatch.builders.repo import RepoMirror
from abwatch.service.compare import lifecycle
from abwatch.service.config import Config
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.store.models import (
    Commit, CommitStatus, Job, JobStatus, Regression, WatchedCommit, WatchProgress,
)
from abwatch.service.watch import bisect, queue

RESUMES = 3  # times a commit's unfinished escalation is queued again by later passes


def unfinished(session: Session, config: Config, row: WatchProgress) -> list[str]:
    """Shas of this watch's tested commits whose run left a regression to verify (``benchmark``)
    or to bisect (``regress`` without a culprit), oldest first."""
    wanted = []
    if config.watch.verify:  # (correctness regressions are never verified: they stay `benchmark`)
        wanted.append(Regression.state == RegressionState.BENCHMARK)
    if directions := bisect.directions(config):
        wanted.append((Regression.state == RegressionState.REGRESS) & Regression.culprit_commit_id.is_(None)
                      & Regression.direction.in_(directions))
    if not wanted:
        return []
    return list(session.scalars(
        select(Commit.sha).join(WatchedCommit, WatchedCommit.commit_id == Commit.id)
        .join(Regression, Regression.run_id == WatchedCommit.run_id)
        .where(WatchedCommit.progress_id == row.id, Regression.kind.in_(bisect.BISECTED_KINDS),
               WatchedCommit.status.in_((CommitStatus.OK, CommitStatus.FAILED)), or_(*wanted))
        .group_by(Commit.sha).order_by(func.min(WatchedCommit.id))))


def resume_unfinished(session: Session, config: Config, row: WatchProgress, messages: list[str]) -> list[str]:
    """Queue the ``test`` job again of each commit :func:`unfinished` names whose job is not
    queued or running now; the shas queued. A commit resumed :data:`RESUMES` times is said to
    be given up (once) instead."""
    queued = []
    for sha in unfinished(session, config, row):
        first = f"test:{row.id}:{sha}"
        prefix = f"resume:{row.id}:{sha}:"
        jobs = list(session.scalars(select(Job).where(
            or_(Job.dedupe_key == first, Job.dedupe_key.startswith(prefix, autoescape=True)))))
        if any(job.status in (JobStatus.QUEUED, JobStatus.RUNNING) for job in jobs):
            continue  # its escalation is under way (or waits its turn)
        resumed = len(jobs) - 1 if any(job.dedupe_key == first for job in jobs) else len(jobs)
        if resumed >= RESUMES:
            continue
        job = queue.enqueue(session, "test", row.device, {"progress_id": row.id, "sha": sha}, f"{prefix}{resumed + 1}")
        if job is None:
            continue
        text = (f"{sha[:12]}: its verification or bisection did not finish; queued again "
                f"({resumed + 1} of {RESUMES})")
        print(f"abwatch watch: {text}", file=sys.stderr)
        messages.append(text)
        queued.append(sha)
    return queued


def clear_departed(session: Session, mirror: RepoMirror, row: WatchProgress, head: str,
                   messages: list[str]) -> list[int]:
    """Close as ``cleared`` each confirmed regression found by this watch whose culprit is no
    longer on the branch (not an ancestor of ``head``); the ids closed."""
    regressions = session.scalars(
        select(Regression).join(WatchedCommit, WatchedCommit.run_id == Regression.run_id)
        .where(WatchedCommit.progress_id == row.id, Regression.state == RegressionState.REGRESS,
               Regression.culprit_commit_id.is_not(None))
        .order_by(Regression.id)).unique().all()
    closed = []
    for regression in regressions:
        culprit = regression.culprit_commit.sha if regression.culprit_commit else ""
        if not culprit or mirror.is_ancestor(culprit, head):
            continue
        text = (f"regression {regression.id} ({regression.workload.name}): its culprit {culprit[:12]} is no "
                f"longer on branch {row.branch!r} (head {head[:12]}; force-pushed): closed as cleared")
        try:
            lifecycle.transition(session, regression, RegressionState.CLEARED, None, text,
                                 expect=RegressionState.REGRESS)
        except lifecycle.ConcurrentTransition:  # another process moved it (fixed it, say) first
            continue
        print(f"abwatch watch: {text}", file=sys.stderr)
        messages.append(text)
        closed.append(regression.id)
    return closed
