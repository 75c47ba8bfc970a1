"""The watch's tables: what it has seen of each branch, the commits it took up, the job
queue, bisection steps, and the alert outbox."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Float, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from abwatch.service.store.base import Base, _enum, utcnow
from abwatch.service.store.commits import Commit, Repository


class DeliveryStatus(str, enum.Enum):
    """Where one alert delivery is (the outbox, :mod:`service.notify.alerts`)."""

    PENDING = "pending"  # recorded; sent by the next delivery round whose time has come
    DELIVERED = "delivered"
    GIVEN_UP = "given_up"  # a 4xx, or still failing after alerts.retry_for_s


class AlertDelivery(Base):
    """One alert to one webhook: recorded before it is sent, then delivered or given up.

    ``webhook`` is the webhook's label (``env:NAME``, or the URL redacted to its host and a
    hash): a webhook's URL is a secret and is never stored.
    """

    __tablename__ = "alert_deliveries"
    id: Mapped[int] = mapped_column(primary_key=True)
    regression_id: Mapped[int | None] = mapped_column(ForeignKey("regressions.id"), index=True)
    event: Mapped[str] = mapped_column(String(32))
    webhook: Mapped[str] = mapped_column(String(1024))
    status: Mapped[DeliveryStatus] = mapped_column(_enum(DeliveryStatus, "delivery_status"), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)  # of the last attempt
    error: Mapped[str | None] = mapped_column(Text)  # of the last attempt
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)  # recorded
    next_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobStatus(str, enum.Enum):
    """Where a queued job is; ``running`` jobs whose worker died go back to ``queued``."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class WatchProgress(Base):
    """What the watch has seen and tested of one branch, per device and configuration."""

    __tablename__ = "watch_progress"
    __table_args__ = (UniqueConstraint("repository_id", "branch", "device", "config_hash"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    branch: Mapped[str] = mapped_column(String(256))
    device: Mapped[str] = mapped_column(String(256))
    config_hash: Mapped[str] = mapped_column(String(64))
    last_seen_sha: Mapped[str | None] = mapped_column(String(64))
    last_tested_sha: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)  # the last loud event (a force-push, ...)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    repository: Mapped[Repository] = relationship()


class CommitStatus(str, enum.Enum):
    """Where one commit the watch took up is."""

    QUEUED = "queued"  # its `test` job waits
    BASELINE = "baseline"  # the watch's first commit: built, so later ones can be compared with it
    OK = "ok"  # compared
    BUILD_FAILED = "build_failed"  # did not build: recorded, never a regression
    FAILED = "failed"  # its job failed (an error) or a workload could not be judged
    SKIPPED = "skipped"  # git gave a commit that could not be read or stored (the reason is kept)


class WatchedCommit(Base):
    """One commit the watch took up for a branch: queued, then ok / build_failed / failed; or
    skipped (it could not be read or stored; ``reason`` says why)."""

    __tablename__ = "watched_commits"
    __table_args__ = (UniqueConstraint("progress_id", "commit_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    progress_id: Mapped[int] = mapped_column(ForeignKey("watch_progress.id"), index=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    status: Mapped[CommitStatus] = mapped_column(_enum(CommitStatus, "watched_commit_status", 16))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    control_sha: Mapped[str | None] = mapped_column(String(64))
    tested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)  # why a `skipped` commit was not taken up
    commit: Mapped[Commit] = relationship()


class Job(Base):
    """One unit of work on one device, claimed with ``FOR UPDATE SKIP LOCKED``."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    device: Mapped[str] = mapped_column(String(256), index=True)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"), index=True)
    dedupe_key: Mapped[str] = mapped_column(String(512), unique=True)
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(256))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class StepSide(str, enum.Enum):
    """Which end of the range a bisection step's commit behaves like."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"  # it did not build or its workload could not run: the range is bisected without it


class StepVerdict(str, enum.Enum):
    """What the deciding comparison of a bisection step said (a verdict), or why there was none."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    UNKNOWN = "unknown"
    FAILED = "failed"  # the workload hung or crashed at this commit
    BUILD_FAILED = "build_failed"


class BisectionStep(Base):
    """One commit tried while bisecting a regression's range, and what it showed.

    ``run_id`` is the run whose verdict decided the step: the comparison against the good end,
    or, when that one could not tell, the one against the bad end.
    """

    __tablename__ = "bisection_steps"
    id: Mapped[int] = mapped_column(primary_key=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    verdict: Mapped[StepVerdict] = mapped_column(_enum(StepVerdict, "step_verdict"))
    side: Mapped[StepSide] = mapped_column(_enum(StepSide, "step_side", 8))
    change_pct: Mapped[float | None] = mapped_column(Float)
    # a step of the bisection into a submodule bump: ``commit`` built with the submodule at this
    # commit (a row of the submodule's repository); None for a step over the branch's commits
    submodule_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id"))
    commit: Mapped[Commit] = relationship(foreign_keys=[commit_id])
    submodule_commit: Mapped[Commit | None] = relationship(foreign_keys=[submodule_commit_id])

    def to_dict(self) -> dict[str, Any]:
        """The step as every reader shows it (CLI, API, pages, alerts)."""
        sub = self.submodule_commit
        return {"sha": self.commit.sha, "summary": self.commit.summary, "side": self.side.value, "verdict": self.verdict.value,
                "change_pct": self.change_pct, "run_id": self.run_id,
                "submodule": {"sha": sub.sha, "summary": sub.summary} if sub else None}
