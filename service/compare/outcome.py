"""What a comparison returns to its caller, and the exit codes of every command: plain values.

Kept apart from :mod:`service.compare.driver` (which builds, measures and judges) so that what reports
a run — the CLI's tables and JSON, ``show`` from stored rows — does not import the building,
measuring and statistics machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from abwatch.core.errors import UsageError
from abwatch.service.exits import EXIT_BUILD_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_REGRESSION
from abwatch.service.store.models import BuildMeasurement, BuildStatus, RunStatus
from abwatch.service.stats.verdict import Outcome, Verdict

if TYPE_CHECKING:
    from abwatch.service.compare.attribution import TvmDetails
    from abwatch.service.compare.building import BuildOutcome

# The exit codes of every abwatch command (README, "Operations").


class DriverError(UsageError):
    """A request the driver cannot carry out (bad run id, nothing to verify, ...)."""


class NothingToVerify(DriverError):
    """The run exists but has no suspected regression left to verify: not an error of the caller."""


class AlreadyVerifying(NothingToVerify):
    """Another verify started on the same regressions a moment earlier and took them."""


@dataclass(frozen=True)
class MetricResult:
    """One metric's verdict of one workload in one phase (the run, or the compile), or of a
    run's two builds (phase ``build``), as the metric registry (``service.compare.metrics``)
    judged it and ``measurements`` (``build_measurements``) stores it: each side's values (one
    per process, in the interleaved order; one per build) and who measured them."""

    metric: str  # a core.metric_names.Metric value
    phase: str  # a RegressionKind value (runtime or compile-time), or "build" for a metric of the builds
    verdict: Verdict
    control_values: tuple[float, ...]
    treatment_values: tuple[float, ...]
    source: str
    failure: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The object ``--json`` and the API show (``results[].metrics``)."""
        v = self.verdict
        return {"metric": self.metric, "phase": self.phase, "unit": v.unit, "verdict": v.verdict.value,
                "change_pct": v.change_pct, "ci_pct": list(v.ci_pct) if v.ci_pct else None,
                "control": v.control_median_ms, "treatment": v.treatment_median_ms, "reason": v.reason,
                "source": self.source, "failure": self.failure, "n": [len(self.control_values),
                                                                      len(self.treatment_values)],
                "design_effect": v.design_effect}  # where the processes shared fork servers


@dataclass(frozen=True)
class WorkloadResult:
    """One workload's verdict in a run, with the rows it lives in (workload series, comparison,
    the regressions it opened), so a caller never looks them up again by name."""

    workload: str
    verdict: Verdict
    comparison_id: int
    regression_id: int | None
    failure: str | None
    correctness_regression_id: int | None = None
    details: TvmDetails | None = None  # TVM workloads that were compared
    workload_id: int | None = None  # the series (workloads row)
    # the instructions verdict and counts (service.compare.instructions.details), where counted
    instructions: dict[str, Any] | None = None
    # a TVM workload's compile call counted the same way, where counted
    compile_instructions: dict[str, Any] | None = None
    # how contended the measured processes were (service.stats.contention), where measured
    contention: dict[str, Any] | None = None
    # the metrics judged from the timed processes (CPU time, peak memory), where measured
    measured: tuple[MetricResult, ...] = ()


@dataclass(frozen=True)
class CompareOutcome:
    """Everything a caller needs to report a run."""

    run_id: int
    run_type: str
    status: str
    builds: list[BuildOutcome]
    results: list[WorkloadResult] = field(default_factory=list)
    # the verdicts on the two builds themselves (binary_size), where measured
    build_metrics: tuple[MetricResult, ...] = ()

    @property
    def exit_code(self) -> int:
        """3 if a build failed, 1 if any regression of a workload (time, instructions, output, or
        a compile's time or instructions), 4 if a workload could not be judged, 1 if the builds
        regressed (their size), else 0. An incomplete run stays 4 whatever its builds' verdict:
        the builds are judged before any workload runs, so a run that must be looked at again
        says so first, and its report and JSON show the builds' verdict."""
        if self.status == RunStatus.BUILD_FAILED.value:
            return EXIT_BUILD_FAILED
        if any(regressed(r) for r in self.results):
            return EXIT_REGRESSION
        if self.status == RunStatus.INCOMPLETE.value:
            return EXIT_INCOMPLETE
        if any(m.verdict.verdict == Outcome.REGRESSION for m in self.build_metrics):
            return EXIT_REGRESSION
        return EXIT_OK

    @property
    def exit_reason(self) -> str:
        """What made :attr:`exit_code` what it is, in one line (the report's last)."""
        code = self.exit_code
        if code == EXIT_BUILD_FAILED:
            failed = [b.side for b in self.builds if b.status != BuildStatus.SUCCESS.value]
            return f"exit {code}: a build failed ({', '.join(failed) or 'see above'}), so nothing was measured"
        workloads = [r.workload for r in self.results if regressed(r)]
        if workloads:
            return f"exit {code}: a regression in {', '.join(workloads)} (abwatch regressions lists it)"
        if code == EXIT_INCOMPLETE:
            unjudged = [r.workload for r in self.results if r.failure]
            return f"exit {code}: not judged: {', '.join(unjudged) or 'the run stopped'}"
        grown = [m for m in self.build_metrics if m.verdict.verdict == Outcome.REGRESSION]
        if grown:
            said = ", ".join(f"{m.metric.replace('_', ' ')} {m.verdict.change_pct:+.2f}%"
                             if m.verdict.change_pct is not None else m.metric.replace("_", " ") for m in grown)
            return (f"exit {code}: the builds themselves regressed ({said}); no workload did "
                    "(abwatch runs and abwatch regressions list it as a build regression)")
        return f"exit {code}: no regression"

    def to_json(self) -> dict:
        """The ``--json`` object of ``abwatch compare``."""
        return {
            "run_id": self.run_id,
            "run_type": self.run_type,
            "status": self.status,
            "exit": {"status": self.exit_code, "why": self.exit_reason},
            "results": [result_json(r) for r in self.results],
            "build_metrics": [m.to_json() for m in self.build_metrics],
            "builds": [
                {"ref": b.ref, "sha": b.sha, "status": b.status, "cached": b.cached, "side": b.side}
                for b in self.builds
            ],
        }


def build_result(row: BuildMeasurement) -> MetricResult:
    """A ``build_measurements`` row as the verdict the driver judged (``CompareOutcome.build_metrics``)."""
    control = (row.control_value,) if row.control_value is not None else ()
    treatment = (row.treatment_value,) if row.treatment_value is not None else ()
    return MetricResult(row.metric.value, "build", Verdict.from_dict(row.judged), control, treatment,
                        row.source or "", row.failure)


def regressed(result: WorkloadResult) -> bool:
    """Whether any verdict of a workload's comparison is a regression: its speed (the first
    metric), its instructions beside it, its output, its compile's time or instructions, or a
    metric of its timed processes (CPU time, peak memory)."""
    compiled = result.details.get("compile") if result.details else None
    beside = (result.instructions, compiled, result.compile_instructions)
    return (result.verdict.verdict == Outcome.REGRESSION or result.correctness_regression_id is not None
            or any((v or {}).get("verdict") == Outcome.REGRESSION.value for v in beside)
            or any(m.verdict.verdict == Outcome.REGRESSION for m in result.measured))


def verdict_json(v: Verdict, run_id: int) -> dict:
    """A verdict a regression keeps as evidence: :meth:`Verdict.to_dict`, the run that made it,
    and both sides' sample counts as ``n``."""
    return {"run_id": run_id, **v.to_dict(), "n": [v.control_n, v.treatment_n]}


def result_json(result: WorkloadResult) -> dict:
    v = result.verdict
    return {
        "workload": result.workload,
        "workload_id": result.workload_id,
        "comparison_id": result.comparison_id,
        "verdict": v.verdict.value,
        "change_pct": v.change_pct,
        "ci_pct": list(v.ci_pct) if v.ci_pct else None,
        # the interval that decides `same` (equivalence, at equivalence_alpha a side)
        "same_ci_pct": list(v.same_ci_pct) if v.same_ci_pct else None,
        "p_value": v.p_value,
        "p_adjusted": v.p_adjusted,
        "correction": v.correction,
        "stop_reason": v.stop_reason,
        "looks": v.looks,
        "elapsed_s": v.elapsed_s,
        # the figures the verdict was judged on (their estimator named), then the plain medians
        "control_ms": v.control_ms,
        "treatment_ms": v.treatment_ms,
        "treatment_ci_ms": list(ci_ms) if (ci_ms := v.treatment_ci_ms()) else None,
        "estimator": v.estimator or None,
        "unit": v.unit,  # "instructions" where the first metric in `measure` is instructions
        "control": {"median_ms": v.control_median_ms, "n": v.control_n},
        "treatment": {"median_ms": v.treatment_median_ms, "n": v.treatment_n},
        "regression_id": result.regression_id,
        "reason": v.reason,
        "method": v.method or None,  # which estimator and interval decided
        # where pairs shared fork servers: the variance's growth from the server level (stats.levels)
        "design_effect": v.design_effect,
        "failure": result.failure,
        **({"ops": result.details["ops"], "error": result.details["error"],
            "compile_ms": result.details["compile_ms"], "compile": result.details.get("compile"),
            "correctness_regression_id": result.correctness_regression_id}
           if result.details is not None else {}),
        **({"instructions": result.instructions} if result.instructions is not None else {}),
        **({"compile_instructions": result.compile_instructions} if result.compile_instructions is not None else {}),
        **({"metrics": [m.to_json() for m in result.measured]} if result.measured else {}),
        # how contended the measured processes were; with "heavy", the verdict was judged on CPU time ("unit")
        "contention": result.contention,
        "caveat": v.caveat or None,
    }
