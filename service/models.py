"""Database models: everything abwatch knows, stored so that people can query it with SQL.

The schema is created only by the Alembic migrations in ``migrations/``; this module
describes it for the ORM. Enums are stored by value as plain strings with a CHECK
constraint, so SQLite and PostgreSQL hold the same text.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the models use."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class BuildStatus(str, enum.Enum):
    """Outcome of building one commit."""

    SUCCESS = "success"
    BUILD_FAILED = "build_failed"


class RunType(str, enum.Enum):
    """FAI-PEP's run types: a normal run, a re-run to confirm, a confirmed regression's run."""

    BENCHMARK = "benchmark"
    VERIFY = "verify"
    REGRESS = "regress"


class RunStatus(str, enum.Enum):
    """Where one A/B run is."""

    RUNNING = "running"
    COMPLETED = "completed"
    BUILD_FAILED = "build_failed"
    FAILED = "failed"


class Side(str, enum.Enum):
    """Which build of the pair."""

    CONTROL = "control"
    TREATMENT = "treatment"


class InvocationStatus(str, enum.Enum):
    """Outcome of one workload process."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


class VerdictKind(str, enum.Enum):
    """The statistics' answer for one workload."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    UNKNOWN = "unknown"


class RegressionState(str, enum.Enum):
    """Escalation states: suspected, being verified, confirmed, or cleared."""

    BENCHMARK = "benchmark"
    VERIFY = "verify"
    REGRESS = "regress"
    CLEARED = "cleared"


class Repository(Base):
    """A git repository under watch."""

    __tablename__ = "repositories"
    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(String(1024), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Commit(Base):
    """One commit of a repository."""

    __tablename__ = "commits"
    __table_args__ = (UniqueConstraint("repository_id", "sha"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    sha: Mapped[str] = mapped_column(String(64), index=True)
    summary: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(256), default="")
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    repository: Mapped[Repository] = relationship()


class Build(Base):
    """One build of a commit with one builder configuration."""

    __tablename__ = "builds"
    id: Mapped[int] = mapped_column(primary_key=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"), index=True)
    builder: Mapped[str] = mapped_column(String(64))
    config_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[BuildStatus] = mapped_column(_enum(BuildStatus, "build_status"))
    artifact_key: Mapped[str | None] = mapped_column(String(128))
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    log: Mapped[str] = mapped_column(Text, default="")
    duration_s: Mapped[float | None] = mapped_column(Float)
    # build metrics: incremental or clean, steps compiled, ccache hits and hit rate
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    commit: Mapped[Commit] = relationship()


class Device(Base):
    """A machine (or board) that runs workloads."""

    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    hardware_config: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Workload(Base):
    """A named thing to time; its spec is the config entry that defines it."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Run(Base):
    """One A/B run: a control build and a treatment build, interleaved on one device."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_type: Mapped[RunType] = mapped_column(_enum(RunType, "run_type"))
    status: Mapped[RunStatus] = mapped_column(_enum(RunStatus, "run_status"))
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    control_ref: Mapped[str] = mapped_column(String(256))
    treatment_ref: Mapped[str] = mapped_column(String(256))
    control_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    treatment_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    control_build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    treatment_build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"))
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    control_commit: Mapped[Commit] = relationship(foreign_keys=[control_commit_id])
    treatment_commit: Mapped[Commit] = relationship(foreign_keys=[treatment_commit_id])
    device: Mapped[Device | None] = relationship()


class Invocation(Base):
    """One workload process of one side; ``position`` is its place in the interleaved order."""

    __tablename__ = "invocations"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    side: Mapped[Side] = mapped_column(_enum(Side, "side"))
    position: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[InvocationStatus] = mapped_column(_enum(InvocationStatus, "invocation_status"))
    wall_s: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")


class Sample(Base):
    """One raw timing, kept forever; warm-up invocations' samples are kept too, flagged."""

    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(primary_key=True)
    invocation_id: Mapped[int] = mapped_column(ForeignKey("invocations.id"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    side: Mapped[Side] = mapped_column(_enum(Side, "side"))
    order_index: Mapped[int] = mapped_column(Integer)
    runtime_ms: Mapped[float] = mapped_column(Float)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)


class Comparison(Base):
    """The statistics' verdict for one workload of one run."""

    __tablename__ = "comparisons"
    __table_args__ = (UniqueConstraint("run_id", "workload_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    verdict: Mapped[VerdictKind] = mapped_column(_enum(VerdictKind, "verdict"))
    change_pct: Mapped[float | None] = mapped_column(Float)
    ci_low_pct: Mapped[float | None] = mapped_column(Float)
    ci_high_pct: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    control_median_ms: Mapped[float | None] = mapped_column(Float)
    treatment_median_ms: Mapped[float | None] = mapped_column(Float)
    control_n: Mapped[int] = mapped_column(Integer)
    treatment_n: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    workload: Mapped[Workload] = relationship()


class Regression(Base):
    """A suspected or confirmed slowdown of one workload between two commits on one device."""

    __tablename__ = "regressions"
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"))
    control_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    treatment_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    comparison_id: Mapped[int] = mapped_column(ForeignKey("comparisons.id"))
    state: Mapped[RegressionState] = mapped_column(_enum(RegressionState, "regression_state"))
    # "speed" (slower) or "correctness" (outputs differ from the control's beyond tolerance)
    kind: Mapped[str] = mapped_column(String(16), default="speed", server_default="speed")
    change_pct: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The verdicts behind the state: the benchmark run's, then the verify run's.
    benchmark_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verify_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    workload: Mapped[Workload] = relationship()
    control_commit: Mapped[Commit] = relationship(foreign_keys=[control_commit_id])
    treatment_commit: Mapped[Commit] = relationship(foreign_keys=[treatment_commit_id])
    events: Mapped[list["RegressionEvent"]] = relationship(
        order_by="RegressionEvent.id", back_populates="regression"
    )


class RegressionEvent(Base):
    """One state change of a regression: when, from what, to what, by which run, why."""

    __tablename__ = "regression_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id"), index=True)
    from_state: Mapped[RegressionState | None] = mapped_column(
        _enum(RegressionState, "regression_event_from")
    )
    to_state: Mapped[RegressionState] = mapped_column(_enum(RegressionState, "regression_event_to"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    regression: Mapped[Regression] = relationship(back_populates="events")


class NoiseProfile(Base):
    """Observed run-to-run noise of one workload on one device, learnt from its `same` verdicts.

    ``process_cv`` is the coefficient of variation of per-process medians (the unit the
    statistics use); it sets how many invocations the next run starts with.
    """

    __tablename__ = "noise_profiles"
    __table_args__ = (UniqueConstraint("workload_id", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    process_cv: Mapped[float] = mapped_column(Float)
    observations: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Record(Base):
    """A TVM benchmark record (schema v0.1), made by a run or imported from a file."""

    __tablename__ = "records"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    side: Mapped[Side | None] = mapped_column(_enum(Side, "record_side"))
    workload: Mapped[str] = mapped_column(String(256), index=True)
    engine: Mapped[str] = mapped_column(String(64))
    engine_version: Mapped[str | None] = mapped_column(String(128))
    hardware: Mapped[str] = mapped_column(String(256))
    runtime_ms_mean: Mapped[float] = mapped_column(Float)
    runtime_ms_std: Mapped[float] = mapped_column(Float)
    timestamp: Mapped[Any] = mapped_column(JSON)
    schema_version: Mapped[str] = mapped_column(String(16))
    fields: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
