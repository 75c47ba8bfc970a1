"""Database models: everything abwatch knows, stored so that people can query it with SQL.

The schema is created only by the Alembic migrations in ``migrations/``; this module
describes it for the ORM. Enums are stored by value as plain strings with a CHECK
constraint, so SQLite and PostgreSQL hold the same text.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from abwatch.core.redact import mask_url
from abwatch.core.sides import Side
from abwatch.service.stats.verdict import Direction, Metric, Outcome, RegressionKind, RegressionState, TriageStatus

from abwatch.service.store.base import Base, _enum, utcnow  # noqa: F401 - utcnow: re-exported
# The tables every other one points at, and the watch's tables: re-exported so that ``models``
# names the whole schema (jobs needs only the first, so neither imports this module).
from abwatch.service.store.artifacts import ArtifactManifest  # noqa: F401 - re-exported
from abwatch.service.store.build_measurements import BuildMeasurement  # noqa: F401 - re-exported
from abwatch.service.store.commits import Commit, Repository
from abwatch.service.store.devices import Device, DeviceHost  # noqa: F401 - DeviceHost: re-exported
from abwatch.service.store.jobs import (  # noqa: F401
    AlertDelivery, BisectionStep, CommitStatus, DeliveryStatus, Job, JobStatus, StepSide, StepVerdict, WatchedCommit,
    WatchProgress,
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
    FAILED = "failed"  # stopped by an unexpected error (recorded in ``error``)
    INCOMPLETE = "incomplete"  # finished, but at least one workload could not be judged
    INTERRUPTED = "interrupted"  # stopped by SIGINT/SIGTERM; what was measured is kept
    ABANDONED = "abandoned"  # its process died (kill -9, power loss); found by a later command


class InvocationStatus(str, enum.Enum):
    """Outcome of one workload process."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


class Build(Base):
    """One build of a commit with one builder configuration.

    A successful build is stored once per artifact key and place (``host:cache_dir``): whoever
    finds the artifact in that place's cache (another process, a later run) points at the same
    row; another place that builds it again gets a row of its own, and one that took it from the
    artifact store points at the row of the build it reused (and the run says so).
    """

    __tablename__ = "builds"
    __table_args__ = (Index("uq_builds_artifact_key_place_success", "artifact_key", "place", unique=True,
                            postgresql_where=text("status = 'success'"),
                            sqlite_where=text("status = 'success'")),)
    id: Mapped[int] = mapped_column(primary_key=True)
    commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"), index=True)
    builder: Mapped[str] = mapped_column(String(64))
    config_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[BuildStatus] = mapped_column(_enum(BuildStatus, "build_status"))
    artifact_key: Mapped[str | None] = mapped_column(String(128))
    cached: Mapped[bool] = mapped_column(Boolean, default=False)  # this place's cache served it
    # where it was built or found: ``host:cache_dir`` (NULL for rows from before places were kept)
    place: Mapped[str | None] = mapped_column(String(400))
    # ``path@sha``: a submodule built at another commit than ``commit`` records (a bisection
    # into a bump); its artifact key differs from the plain build's
    submodule_pin: Mapped[str | None] = mapped_column(String(300))
    log: Mapped[str] = mapped_column(Text, default="")
    duration_s: Mapped[float | None] = mapped_column(Float)
    # build metrics: incremental or clean, steps compiled, ccache hits and hit rate
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    commit: Mapped[Commit] = relationship()


class Workload(Base):
    """One series of measurements: a named thing to time in one repository, with one spec.

    The identity is (repository, name, spec hash): two configs (or two repositories) with a
    workload called ``mlp`` get two rows, and so does a workload whose spec changed (a new
    series starts). ``spec`` is the config entry that defines it and never changes.
    """

    __tablename__ = "workloads"
    __table_args__ = (UniqueConstraint("repository_id", "name", "spec_hash"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    name: Mapped[str] = mapped_column(String(256), index=True)
    spec_hash: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    repository: Mapped[Repository] = relationship()


class Run(Base):
    """One A/B run: a control build and a treatment build, interleaved on one device."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_device_id_started_at", "device_id", "started_at"),)
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
    # Who runs it, so a later command can tell a live run from one whose process died.
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    process_started_at: Mapped[float | None] = mapped_column(Float)  # epoch seconds (psutil)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # when its raw samples were deleted (service.store.prune); its verdicts and invocations are kept
    samples_pruned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    control_commit: Mapped[Commit] = relationship(foreign_keys=[control_commit_id])
    treatment_commit: Mapped[Commit] = relationship(foreign_keys=[treatment_commit_id])
    device: Mapped[Device | None] = relationship()


class Invocation(Base):
    """One workload process of one side; ``position`` is its place in the interleaved order."""

    __tablename__ = "invocations"
    # the target of samples' one foreign key, which also checks their run and workload
    __table_args__ = (UniqueConstraint("id", "run_id", "workload_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    side: Mapped[Side] = mapped_column(_enum(Side, "side"))
    position: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[InvocationStatus] = mapped_column(_enum(InvocationStatus, "invocation_status"))
    wall_s: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")
    # how contended the process was: CPU seconds it used (user + system, all its threads) and
    # involuntary context switches over usage_wall_s seconds (a command workload: the whole
    # process, from wait4; a TVM worker: its timing batch); NULL where not measured
    cpu_s: Mapped[float | None] = mapped_column(Float)
    involuntary_switches: Mapped[int | None] = mapped_column(BigInteger)
    usage_wall_s: Mapped[float | None] = mapped_column(Float)
    max_rss_kb: Mapped[int | None] = mapped_column(BigInteger)  # peak resident memory (or its timed region's)
    # a forked TVM worker's fork server, by its number in the runner's sequence of servers (its
    # children share one memory layout: a level above the process); NULL for a fresh process
    server: Mapped[int | None] = mapped_column(Integer)
    # a server's first child: how long that server took to start (seconds), whether the child
    # waited for it or it was started ahead (what a server costs, service/compare/noise.py)
    server_start_s: Mapped[float | None] = mapped_column(Float)


class Sample(Base):
    """One raw timing; warm-up invocations' samples are kept too, flagged. Kept until pruned:
    ``abwatch db prune`` or ``[retention]`` delete those of old runs that opened nothing
    (``runs.samples_pruned_at`` says when)."""

    __tablename__ = "samples"
    # One composite foreign key instead of three: PostgreSQL checks each sample row with a
    # trigger per foreign key, and three checks made the bulk write 3x slower (measured in
    # benchmarks/store.py); this one also proves run_id and workload_id match the invocation.
    __table_args__ = (ForeignKeyConstraint(
        ["invocation_id", "run_id", "workload_id"],
        ["invocations.id", "invocations.run_id", "invocations.workload_id"]),)
    id: Mapped[int] = mapped_column(primary_key=True)
    invocation_id: Mapped[int] = mapped_column(index=True)
    run_id: Mapped[int] = mapped_column(index=True)
    workload_id: Mapped[int] = mapped_column()
    side: Mapped[Side] = mapped_column(_enum(Side, "side"))
    order_index: Mapped[int] = mapped_column(Integer)
    runtime_ms: Mapped[float] = mapped_column(Float)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)
    # its own CPU time where the worker marked it (TVM workers on the host CPU), else NULL
    cpu_ms: Mapped[float | None] = mapped_column(Float, nullable=True)


# What a workload's series reads from each comparison: kept in its index on PostgreSQL, so
# a two-year series is an index-only scan instead of thousands of scattered heap pages.
SERIES_COLUMNS = ["control_median_ms", "treatment_median_ms", "control_n", "treatment_n", "verdict",
                  "change_pct", "ci_low_pct", "ci_high_pct"]


class Comparison(Base):
    """The statistics' verdict for one workload of one run."""

    __tablename__ = "comparisons"
    # (workload, newest run first) answers "latest verdict per workload and device" by index
    __table_args__ = (UniqueConstraint("run_id", "workload_id"),
                      Index("ix_comparisons_workload_id_run_id", "workload_id", "run_id",
                            postgresql_include=SERIES_COLUMNS))
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    verdict: Mapped[Outcome] = mapped_column(_enum(Outcome, "verdict"))  # the statistics' own enum
    change_pct: Mapped[float | None] = mapped_column(Float)
    ci_low_pct: Mapped[float | None] = mapped_column(Float)
    ci_high_pct: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    control_median_ms: Mapped[float | None] = mapped_column(Float)
    treatment_median_ms: Mapped[float | None] = mapped_column(Float)
    # each side's processes by their fastest sample, the median of those: what the trend plots
    control_fastest_ms: Mapped[float | None] = mapped_column(Float)
    treatment_fastest_ms: Mapped[float | None] = mapped_column(Float)
    control_n: Mapped[int] = mapped_column(Integer)
    treatment_n: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)  # its shape: details_version()
    workload: Mapped[Workload] = relationship()
    measurements: Mapped[list[MetricMeasurement]] = relationship(
        back_populates="comparison", order_by="MetricMeasurement.id", cascade="all, delete-orphan")


# comparisons.details, in the shapes it has had (the newest is written with "version": 3):
# 1: the verdict's fields without a column, flat beside a TVM workload's (compile_ms, ops, ...);
# 2: the whole verdict under "verdict", the compile and instructions verdicts whole under their keys;
# 3 (migration 0029 on): those verdicts are measurements rows; details keeps what a row does not hold.
DETAILS_VERSION = 3
_SHOWN_APART = ("compile", "instructions", "compile_instructions")


def details_version(details: dict[str, Any] | None) -> int:
    """The shape of a comparison's ``details`` (see :data:`DETAILS_VERSION`): as written, or
    for rows written before the version was, read from their keys."""
    details = details or {}
    if isinstance(details.get("version"), int):
        return details["version"]
    if not isinstance(details.get("verdict"), dict):
        return 1
    whole = any(isinstance(details.get(k), dict) and details[k].get("verdict") for k in _SHOWN_APART)
    return 2 if whole else 3


class MetricMeasurement(Base):
    """What one comparison measured by one metric in one phase (the run, or the compile): its
    verdict, each side's figure and values. One row per judged metric (the service's metric
    registry, ``service.compare.metrics``); the comparison's own columns repeat its first."""

    __tablename__ = "measurements"
    __table_args__ = (UniqueConstraint("comparison_id", "phase", "metric"),
                      Index("ix_measurements_metric_phase", "metric", "phase"))
    id: Mapped[int] = mapped_column(primary_key=True)
    comparison_id: Mapped[int] = mapped_column(ForeignKey("comparisons.id", ondelete="CASCADE"))
    phase: Mapped[RegressionKind] = mapped_column(_enum(RegressionKind, "phase", 16))  # runtime | compile-time
    metric: Mapped[Metric] = mapped_column(_enum(Metric, "metric", 16, checked=False))  # the registry's names
    unit: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[Outcome] = mapped_column(_enum(Outcome, "verdict"))
    change_pct: Mapped[float | None] = mapped_column(Float)
    ci_low_pct: Mapped[float | None] = mapped_column(Float)
    ci_high_pct: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    control_value: Mapped[float | None] = mapped_column(Float)  # the figure each side is shown by
    treatment_value: Mapped[float | None] = mapped_column(Float)
    # each side's values, one per process in its interleaved order (NULL for run time: the samples)
    control_values: Mapped[list[float] | None] = mapped_column(JSON)
    treatment_values: Mapped[list[float] | None] = mapped_column(JSON)
    source: Mapped[str | None] = mapped_column(String(32))  # who measured it (perf, valgrind, wait4, ...)
    failure: Mapped[str | None] = mapped_column(Text)
    judged: Mapped[dict[str, Any]] = mapped_column(JSON)  # the whole verdict (Verdict.to_dict)
    comparison: Mapped[Comparison] = relationship(back_populates="measurements")


# A regression is open in these states; one pair/workload/device/kind has at most one open.
OPEN_REGRESSION_STATES = ("benchmark", "verify", "regress")
OPEN_REGRESSION_SQL = "state IN ('benchmark', 'verify', 'regress')"  # uq_regressions_open's predicate
_OPEN = text(OPEN_REGRESSION_SQL)


class Regression(Base):
    """A suspected or confirmed slowdown of one workload between two commits on one device.

    ``version`` grows with every change of the row; the ORM checks it on each UPDATE, so two
    processes that both read a regression cannot both move it (the second one's write finds
    a newer version and fails instead of overwriting).
    """

    __tablename__ = "regressions"
    # re-running a pair finds the open regression instead of opening a second one
    __table_args__ = (Index("uq_regressions_open", "workload_id", "device_id", "control_commit_id",
                            "treatment_commit_id", "kind", unique=True,
                            postgresql_where=_OPEN, sqlite_where=_OPEN),)
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"))
    control_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    treatment_commit_id: Mapped[int] = mapped_column(ForeignKey("commits.id"))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    comparison_id: Mapped[int] = mapped_column(ForeignKey("comparisons.id"))
    state: Mapped[RegressionState] = mapped_column(_enum(RegressionState, "regression_state"), index=True)
    # the latest triage decision, if a person made one (the decisions are triage_events)
    triage: Mapped[TriageStatus | None] = mapped_column(_enum(TriageStatus, "triage_status"))
    kind: Mapped[RegressionKind] = mapped_column(_enum(RegressionKind, "regression_kind", 16),
                                                 default=RegressionKind.RUNTIME, server_default="runtime")
    # the metric whose verdict opened it (and verifies and bisects it): a name of the metric registry
    metric: Mapped[Metric] = mapped_column(_enum(Metric, "metric", 16, checked=False), default=Metric.TIME,
                                           server_default="time")
    # slower (a regression) or faster (a confirmed improvement whose cause is bisected; [watch] bisect)
    direction: Mapped[Direction] = mapped_column(_enum(Direction, "regression_direction", 8),
                                                 default=Direction.SLOWER, server_default="slower")
    change_pct: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The verdicts behind the state: the benchmark run's, then the verify run's.
    benchmark_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    verify_verdict: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Named by bisection (or the range itself when it is one commit); null while unknown.
    culprit_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id"))
    # when the culprit moves a submodule of [build] submodules: the path and the submodule's own
    # commit the bisection into the bump named (a row of the submodule's repository)
    culprit_submodule_path: Mapped[str | None] = mapped_column(String(256))
    culprit_submodule_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id"))
    # the commit that fixed it, named by bisecting from where it was last seen to the commit the
    # watch found it fixed at (the first commit back at the good commit's level); null until then
    fixed_by_commit_id: Mapped[int | None] = mapped_column(ForeignKey("commits.id"))
    # Regressions with the same culprit on one device share a group: the lowest regression id.
    group_id: Mapped[int | None] = mapped_column(Integer, index=True)
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    workload: Mapped[Workload] = relationship()
    device: Mapped[Device | None] = relationship()
    control_commit: Mapped[Commit] = relationship(foreign_keys=[control_commit_id])
    treatment_commit: Mapped[Commit] = relationship(foreign_keys=[treatment_commit_id])
    culprit_commit: Mapped[Commit | None] = relationship(foreign_keys=[culprit_commit_id])
    culprit_submodule_commit: Mapped[Commit | None] = relationship(foreign_keys=[culprit_submodule_commit_id])
    fixed_by_commit: Mapped[Commit | None] = relationship(foreign_keys=[fixed_by_commit_id])
    bisection: Mapped[list[BisectionStep]] = relationship(order_by="BisectionStep.position")
    events: Mapped[list[RegressionEvent]] = relationship(
        order_by="RegressionEvent.id", back_populates="regression"
    )
    triage_events: Mapped[list[TriageEvent]] = relationship(order_by="TriageEvent.id")
    __mapper_args__ = {"version_id_col": version}

    @property
    def fixed_by(self) -> str | None:
        """The fixing commit of a regression triaged ``fixed`` (its latest such decision's), else None."""
        if self.triage is not TriageStatus.FIXED:
            return None
        return next((t.fixed_by for t in reversed(self.triage_events) if t.status is TriageStatus.FIXED), None)

    @property
    def culprit_submodule(self) -> dict[str, Any] | None:
        """The submodule commit a bisection into the culprit's bump named (path, sha, summary,
        author), or None."""
        sub = self.culprit_submodule_commit
        return None if sub is None else {"path": self.culprit_submodule_path, "sha": sub.sha, "summary": sub.summary,
                                         "author": sub.author}

    @property
    def culprit_line(self) -> str | None:
        """``culprit: <sha> <subject>``, and ``-> <submodule path> <sha> <subject>`` when the
        bisection went on into the culprit's submodule bump; None before a culprit is named."""
        culprit, sub = self.culprit_commit, self.culprit_submodule_commit
        if culprit is None:
            return None
        line = ("cause" if self.direction is Direction.FASTER else "culprit") + f": {culprit.sha[:12]} {culprit.summary}"
        return line + (f" -> {self.culprit_submodule_path} {sub.sha[:12]} {sub.summary}" if sub else "")

    def to_dict(self) -> dict[str, Any]:
        """The one shape of a regression that every reader shows: ``abwatch regressions --json``,
        ``GET /api/regressions/{id}``, the regression page and alerts (range, bisected culprit,
        bisection steps, state history)."""
        culprit = self.culprit_commit
        return {
            "id": self.id, "workload": self.workload.name,
            "repository": mask_url(self.workload.repository.url) if self.workload.repository else None,
            "kind": RegressionKind(self.kind).value, "metric": Metric(self.metric or Metric.TIME).value, "state": self.state.value,
            "change_pct": self.change_pct,
            "run_id": self.run_id, "control_sha": self.control_commit.sha, "treatment_sha": self.treatment_commit.sha,
            "benchmark_verdict": self.benchmark_verdict, "verify_verdict": self.verify_verdict,
            "device": self.device.name if self.device else None,
            "range": {"good": self.control_commit.sha, "bad": self.treatment_commit.sha},
            "culprit": {"sha": culprit.sha, "summary": culprit.summary, "author": culprit.author,
                        "submodule": self.culprit_submodule} if culprit else None,
            "culprit_line": self.culprit_line,
            "direction": Direction(self.direction or Direction.SLOWER).value,
            "fixed_by_commit": None if (fixing := self.fixed_by_commit) is None else {
                "sha": fixing.sha, "summary": fixing.summary, "author": fixing.author},
            "bisection": [step.to_dict() for step in self.bisection],
            "group": self.group_id,
            "events": [{"from": e.from_state.value if e.from_state else None, "to": e.to_state.value,
                        "run_id": e.run_id, "reason": e.reason, "at": e.at.isoformat()} for e in self.events],
        }


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


class TriageEvent(Base):
    """One triage decision: who decided what about a regression, when, and why."""

    __tablename__ = "triage_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id"), index=True)
    status: Mapped[TriageStatus] = mapped_column(_enum(TriageStatus, "triage_event_status"))
    who: Mapped[str] = mapped_column(String(256))
    issue_url: Mapped[str | None] = mapped_column(String(1024))
    note: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # a `fixed` decision's fixing commit, as the person named it (7 to 40 hex digits); else null
    fixed_by: Mapped[str | None] = mapped_column(String(40))


class NoiseProfile(Base):
    """Observed run-to-run noise of one workload on one device, and the repetitions that reach
    an interval fastest there.

    ``process_cv`` is the coefficient of variation of per-process medians (the unit the
    statistics use), learnt from `same` verdicts (``observations`` of them; NULL: none yet);
    it sets how many invocations the next run starts with. The counts are learnt from every
    trusted run whatever its verdict (``lessons`` of them): ``samples`` (a TVM workload's): the
    samples a process that reach an interval fastest, learnt from a run that took the
    workload's own count (service/stats/repetitions.py); NULL: none learnt. ``children`` (a
    forked TVM workload's): the children a fork server that reach it fastest, learnt from a
    forked run (:func:`service.stats.choose_children`); NULL: the runner's. ``server_share``:
    the mean share of a forked workload's process variance between its fork servers over
    ``server_share_runs`` runs (a plain mean up to MEMORY runs, then following drift), which each children choice
    pools with its own run's; NULL: none measured.
    """

    __tablename__ = "noise_profiles"
    __table_args__ = (UniqueConstraint("workload_id", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    process_cv: Mapped[float | None] = mapped_column(Float)
    observations: Mapped[int] = mapped_column(Integer)
    lessons: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    samples: Mapped[int | None] = mapped_column(Integer)
    samples_reason: Mapped[str | None] = mapped_column(Text)
    children: Mapped[int | None] = mapped_column(Integer)
    children_reason: Mapped[str | None] = mapped_column(Text)
    server_share: Mapped[float | None] = mapped_column(Float)
    server_share_runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


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
    # sha256 of the record's content: the same record imported twice is stored once
    record_key: Mapped[str | None] = mapped_column(String(64), index=True, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SchemaVersion(Base):
    """The abwatch version that first migrated this database to a revision (written by
    ``migrations/env.py``): an older abwatch names it when the database is newer than it."""

    __tablename__ = "schema_versions"
    revision: Mapped[str] = mapped_column(String(64), primary_key=True)
    abwatch_version: Mapped[str] = mapped_column(String(64))
    migrated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
