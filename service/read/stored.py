"""Runs and builds as the database keeps them: what ``show``, ``runs`` and ``builds`` read.

:func:`load_outcome` rebuilds a run's :class:`~service.compare.outcome.CompareOutcome` from its stored
rows alone. ``compare`` and ``verify`` render their report from it too, so ``abwatch show RUN``
prints, byte for byte, what the command that made the run printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, cast

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from abwatch.core.sides import Side
from abwatch.core.redact import mask_secrets
from abwatch.core.metric_names import SHOWN_APART
from abwatch.service.compare.building import BuildOutcome, reuse, run_place
from abwatch.service.compare.outcome import CompareOutcome, DriverError, MetricResult, WorkloadResult, build_result
from abwatch.service.store.models import (
    Build, BuildMeasurement, BuildStatus, Comparison, Regression, RegressionEvent, Run, RunType, details_version,
)
from abwatch.service.stats.verdict import Direction, Outcome, Verdict, RegressionKind

if TYPE_CHECKING:  # a TypedDict: at run time it is a dict, and attribution imports NumPy
    from abwatch.service.compare.attribution import TvmDetails

# comparisons.details holds the whole verdict under "verdict" (Verdict.to_dict), beside the
# workload's own details (tvm: compile_ms, ops, error, workers). Rows written before that kept
# the verdict's fields that have no column flat among those details: these keys.
LEGACY_VERDICT_KEYS = frozenset({
    "verdict", "reason", "threshold_pct", "alpha", "confidence", "p_adjusted", "correction", "stop_reason",
    "method", "looks", "elapsed_s", "version",
})
# The verdicts a workload's result shows under keys of their own, and the measurements row each
# is (phase, metric): since 0029 comparisons.details keeps of them only what the row does not
# hold (the instruction profiles, the compile-time regression a run opened); before, whole.
SHOWN = {"compile": ("compile-time", "time"), "instructions": ("runtime", "instructions"),
         "compile_instructions": ("compile-time", "instructions")}


@dataclass(frozen=True)
class StoredRun:
    """A run as stored: its outcome, and what a report adds (refs, times, the failed builds' logs)."""

    outcome: CompareOutcome
    control_ref: str
    treatment_ref: str
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    parent_run_id: int | None
    failed_logs: dict[int, str] = field(default_factory=dict)  # build id -> log, failed builds only
    samples_pruned_at: datetime | None = None  # its raw samples were deleted then (service.store.prune)


def load_outcome(session: Session, run_id: int) -> StoredRun:
    """The stored run ``run_id`` as the driver's outcome; a clear error if there is none."""
    run = session.get(Run, run_id)
    if run is None:
        raise DriverError(f"run {run_id} does not exist (see `abwatch runs`)")
    builds, logs = [], {}
    for side, build_id, ref, commit in (
        (Side.CONTROL, run.control_build_id, run.control_ref, run.control_commit),
        (Side.TREATMENT, run.treatment_build_id, run.treatment_ref, run.treatment_commit),
    ):
        if build_id is None:
            continue
        build = session.get(Build, build_id)
        if build is None:  # a foreign key: only a damaged database gets here
            raise DriverError(f"run {run_id}: its {side} build {build_id} does not exist")
        builds.append(BuildOutcome(side, ref, commit.sha, build.status.value,
                                   _cached_for(session, run, side, build), build.id, reused=reuse(build, run_place(run))))
        if build.status != BuildStatus.SUCCESS:
            logs[build.id] = mask_secrets(build.log or "")  # one stored before its secret was known
    speed, correctness = _regressions_by_workload(session, run)
    results = []
    comparisons = session.scalars(select(Comparison).where(Comparison.run_id == run.id).order_by(Comparison.id))
    for c in comparisons:
        shown = _shown(c)
        results.append(WorkloadResult(
            c.workload.name, _verdict(c), c.id, speed.get(c.workload_id), c.error,
            correctness.get(c.workload_id), _tvm_details(c, shown.get("compile")), workload_id=c.workload_id,
            instructions=shown.get("instructions"), compile_instructions=shown.get("compile_instructions"),
            contention=(c.details or {}).get("contention"), measured=_measured(c),
        ))
    judged = session.scalars(select(BuildMeasurement).where(BuildMeasurement.run_id == run.id)
                             .order_by(BuildMeasurement.id))
    outcome = CompareOutcome(run.id, run.run_type.value, run.status.value, builds, results,
                             tuple(build_result(row) for row in judged))
    return StoredRun(outcome, run.control_ref, run.treatment_ref, run.started_at, run.finished_at,
                     run.error, run.parent_run_id, logs, run.samples_pruned_at)


def _measured(c: Comparison) -> tuple[MetricResult, ...]:
    """The verdicts of the metrics shown with the others (all but time's and instructions'), as
    the driver returned them."""
    return tuple(MetricResult(row.metric.value, row.phase.value, Verdict.from_dict(row.judged),
                              tuple(row.control_values or ()), tuple(row.treatment_values or ()), row.source or "",
                              row.failure)
                 for row in c.measurements if row.metric not in SHOWN_APART)


def _shown(c: Comparison) -> dict[str, dict]:
    """The compile's time and the instructions verdicts as the driver showed them
    (``service.compare.compile_time.details``, ``service.compare.instructions.details``): from
    the comparison's ``measurements`` rows with what ``details`` keeps beside them, or whole from
    ``details`` (rows written before 0029)."""
    details, shown = c.details or {}, {}
    whole_kept = details_version(details) < 3  # written before 0029: each verdict whole in details
    rows = {(row.phase.value, row.metric.value): row for row in c.measurements}
    for key, (phase, metric) in SHOWN.items():
        found = details.get(key)
        kept: dict = found if isinstance(found, dict) else {}
        row = rows.get((phase, metric))
        if (whole_kept and kept.get("verdict")) or row is None:  # whole, or nothing measured
            if kept:
                shown[key] = kept
            continue
        control, treatment = list(row.control_values or []), list(row.treatment_values or [])
        whole = {**row.judged, "n": [len(control), len(treatment)], "failure": row.failure}
        if metric == "instructions":
            whole.update(source=row.source, control_counts=[int(v) for v in control],
                         treatment_counts=[int(v) for v in treatment])
        else:
            whole.update(control_ms=control, treatment_ms=treatment)
        shown[key] = {**whole, **kept}
    return shown


def _tvm_details(c: Comparison, compiled: dict | None = None) -> TvmDetails | None:
    """The TVM details a comparison row stores beside its verdict, if it has them, with its
    compile's verdict (``compiled``: :func:`_shown`'s)."""
    extra = {k: v for k, v in (c.details or {}).items() if k not in LEGACY_VERDICT_KEYS}
    if "compile_ms" not in extra:
        return None
    if compiled is not None:
        extra["compile"] = compiled
    # written by the driver from a TvmDetails; the row's JSON is that dict again
    return cast("TvmDetails", extra)


def _verdict(c: Comparison) -> Verdict:
    """The verdict a comparison row stores (rows of before the whole verdict was kept: from
    its columns and the flat keys)."""
    d = c.details or {}
    if details_version(d) >= 2:
        return Verdict.from_dict(d["verdict"])
    ci = (c.ci_low_pct, c.ci_high_pct) if c.ci_low_pct is not None and c.ci_high_pct is not None else None
    return Verdict(
        c.verdict, c.change_pct, ci, c.p_value, c.control_n, c.treatment_n,
        c.control_median_ms, c.treatment_median_ms, d.get("threshold_pct", 0.0), d.get("alpha", 0.0),
        d.get("confidence", 0.0), d.get("reason", ""), d.get("p_adjusted"), d.get("correction", "none"),
        d.get("stop_reason", ""), d.get("method", ""), d.get("looks", 0), d.get("elapsed_s"),
    )


def _cached_for(session: Session, run: Run, side: str, build: Build) -> bool:
    """Whether the run reused an existing build for ``side``.

    A reused build keeps the row of the run that made it, so it is cached for this run when an
    earlier run used the same row, when the treatment is the control's build (an A/A run), or
    when the artifact came from the cache before any run recorded it.
    """
    if build.status != BuildStatus.SUCCESS:
        return False
    if side == Side.TREATMENT and run.control_build_id == build.id:
        return True
    earlier = session.scalar(select(exists().where(
        Run.id < run.id, or_(Run.control_build_id == build.id, Run.treatment_build_id == build.id))))
    return bool(earlier or build.cached)


def _regressions_by_workload(session: Session, run: Run) -> tuple[dict[int, int], dict[int, int]]:
    """(speed, correctness) regression ids by workload id: the ones the run opened, or for a
    verify run the ones it judged."""
    if run.run_type == RunType.VERIFY:
        query = select(Regression).where(
            Regression.id.in_(select(RegressionEvent.regression_id).where(RegressionEvent.run_id == run.id)))
    else:
        query = select(Regression).where(Regression.run_id == run.id)
    speed: dict[int, int] = {}
    correctness: dict[int, int] = {}
    for r in session.scalars(query.where(Regression.direction == Direction.SLOWER).order_by(Regression.id)):
        (correctness if r.kind == RegressionKind.CORRECTNESS else speed)[r.workload_id] = r.id
    return speed, correctness


def list_runs(session: Session, limit: int = 20) -> list[tuple[Run, dict[str, int], dict[str, str]]]:
    """The newest runs first, each with how many of its workloads got each verdict and the
    verdict on each metric of its two builds (``{"binary_size": "regression"}``): a run that
    exits 1 because its builds grew says so here too."""
    runs = list(session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)))
    counts: dict[int, dict[str, int]] = {r.id: {} for r in runs}
    builds: dict[int, dict[str, str]] = {r.id: {} for r in runs}
    if runs:
        for run_id, verdict in session.execute(
                select(Comparison.run_id, Comparison.verdict).where(Comparison.run_id.in_(counts))):
            counts[run_id][verdict.value] = counts[run_id].get(verdict.value, 0) + 1
        for run_id, metric, verdict in session.execute(
                select(BuildMeasurement.run_id, BuildMeasurement.metric, BuildMeasurement.verdict)
                .where(BuildMeasurement.run_id.in_(counts))):
            builds[run_id][str(getattr(metric, "value", metric))] = verdict.value
    return [(r, counts[r.id], builds[r.id]) for r in runs]


def build_regressions(session: Session, limit: int = 20) -> list[tuple[Run, BuildMeasurement]]:
    """The newest runs whose two builds themselves regressed (a metric of the builds, such as
    their binary size), with that verdict: no regression row holds them (no workload did it),
    yet they make a run exit 1, so ``abwatch regressions`` lists them apart."""
    rows = session.execute(select(Run, BuildMeasurement).join(BuildMeasurement, BuildMeasurement.run_id == Run.id)
                           .where(BuildMeasurement.verdict == Outcome.REGRESSION)
                           .order_by(Run.id.desc()).limit(limit))
    return [(run, measured) for run, measured in rows]


def list_builds(session: Session, failed: bool = False, limit: int = 20, builder: str | None = None) -> list[Build]:
    """The newest builds first (only failed ones if ``failed``, only ``builder``'s if given)."""
    query = select(Build).order_by(Build.id.desc()).limit(limit)
    if failed:
        query = query.where(Build.status != BuildStatus.SUCCESS)
    if builder is not None:
        query = query.where(Build.builder == builder)
    return list(session.scalars(query))


def get_build(session: Session, build_id: int) -> Build:
    """One build; a clear error if there is none."""
    build = session.get(Build, build_id)
    if build is None:
        raise DriverError(f"build {build_id} does not exist (see `abwatch builds`)")
    return build
