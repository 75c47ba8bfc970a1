"""What every metric class of the registry (:mod:`.metrics`) is made of: the context a metric
is measured in (:class:`Context`, :class:`Job`), the interface (:class:`MetricKind`), and the two
shapes most metrics take: judged beside the timing from what the timed invocations produced
(:class:`Beside`), and per process, paired by the interleaved order (:class:`FromProcesses`).
Apart from the registry so that the concrete metrics read in one module."""

from __future__ import annotations

import abc
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from abwatch.core.metric_names import Metric
from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.harness import Measurement
from abwatch.service import stats
from abwatch.service.compare import compile_time, contended
from abwatch.service.compare.outcome import MetricResult, WorkloadResult
from abwatch.service.config import Config
from abwatch.service.stats.verdict import RegressionKind

RUN, COMPILE = RegressionKind.RUNTIME, RegressionKind.COMPILE_TIME
SIDES = (CONTROL, TREATMENT)
Judgement = tuple[stats.Verdict, str | None]  # a verdict, and why it was not judged (None when it was)


# what a metric judged in processes of its own: a compile_time.CompileJudged or an
# instructions.CountJudged (a verdict, each side's values, a failure; a CountJudged its source)
Judged = Any
# (metric, phase) -> what it judged in processes of its own, in registry order
Own = dict[tuple[Metric, RegressionKind], Judged]


@dataclass(frozen=True)
class Job:
    """What a metric measuring in processes of its own is given: the runner, the workload and
    the built pair, and the run's seed, generator, progress and time limit per process."""

    runner: Any  # a runners.runner.Runner
    workload: Any
    artifacts: Mapping[Any, Any]  # side -> the artifact's directory
    config: Config
    seed: int
    rng: random.Random
    progress: Any
    timeout_s: float


@dataclass(frozen=True)
class Context:
    """What one workload's measuring produced, for the metrics judged from it."""

    workload: Any  # a builders.spec workload config
    config: Config
    timed: Measurement  # the timed invocations (warm-up excluded)
    compiled: compile_time.CompileJudged | None  # the fresh-process compiles, where measured
    seed: int


class MetricKind(abc.ABC):
    """One metric: its unit and default threshold, its measuring, and its verdict in a result."""

    metric: ClassVar[Metric]
    unit: ClassVar[str]
    default_threshold_pct: ClassVar[float]
    # the v0.1 record's field of each side's median (``compilation_`` before it for the compile's)
    record_field: ClassVar[str | None] = None

    def threshold_pct(self, config: Config) -> float:
        """The smallest change worth reporting (%): ``[stats] thresholds``, else the default."""
        return config.stats.thresholds.get(self.metric, self.default_threshold_pct)

    def measure(self, ctx: Context) -> list[MetricResult]:
        """Its verdicts (one per phase it applies to) from what the timed processes produced;
        none where it is measured in processes of its own (:meth:`own`) or not asked for."""
        return []

    def own(self, job: Job) -> dict[RegressionKind, Judged | None]:
        """What it measures in processes of its own, per phase (the compile's time, the counted
        processes), judged; None where a phase was not measured. Called in registry order, each
        workload, after its timed invocations (they draw on one seeded generator in turn)."""
        return {}

    def result(self, phase: RegressionKind, judged: Judged) -> MetricResult:
        """One phase of :meth:`own` as a verdict with each side's values (a ``measurements`` row)."""
        return MetricResult(self.metric.value, phase.value, judged.verdict, tuple(judged.samples[CONTROL]),
                            tuple(judged.samples[TREATMENT]), getattr(judged, "source", ""), judged.failure)

    def shown(self, phase: RegressionKind, judged: Judged) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """Where a workload's result shows one phase of :meth:`own` under a key of its own (the
        JSON shapes that predate the registry): (key, the whole object, what of it the
        ``measurements`` row does not hold, which ``comparisons.details`` keeps); None: shown
        with the other metrics (``WorkloadResult.measured``)."""
        return None

    def said(self, phase: RegressionKind, judged: Judged) -> str:
        """The progress line of one phase of :meth:`own`."""
        v = judged.verdict
        return f"{self.metric.value} ({phase.value}) {v.verdict.value} — {v.reason}"

    def measure_builds(self, control: Mapping[str, Any] | None, treatment: Mapping[str, Any] | None,
                       config: Config) -> MetricResult | None:
        """Its verdict between a run's two builds, from their rows' ``metrics``, for a metric of
        the builds (``OF_BUILDS``); None for a metric of workloads, or where neither build has it."""
        return None

    @abc.abstractmethod
    def judged(self, result: WorkloadResult, phase: RegressionKind) -> Judgement:
        """Its verdict of ``phase`` in a workload's result (what verify and bisection judge a
        regression it opened by), and why it was not judged (None when it was)."""


class Beside(MetricKind):
    """A metric judged beside the timing, from what the timed invocations produced: its
    verdicts are a workload result's ``measured``."""

    def judged(self, result: WorkloadResult, phase: RegressionKind) -> Judgement:
        if result.failure:
            return result.verdict, result.failure
        found = next((m for m in result.measured if m.metric == self.metric.value and m.phase == phase.value), None)
        if found is None:
            why = f"{self.metric.value} not measured"
            return replace(stats.compare([], []), reason=f"not judged: {why}", unit=self.unit), why
        return found.verdict, found.failure


class FromProcesses(Beside):
    """A metric each measured process reports beside its samples: judged per process, the
    control's i-th process paired with the treatment's i-th (they ran next to each other)."""

    source: ClassVar[str]
    phases: ClassVar[tuple[RegressionKind, ...]] = (RUN,)

    @abc.abstractmethod
    def values(self, ctx: Context, phase: RegressionKind) -> dict[str, list[tuple[int, float | None]]]:
        """Each side's (position, value) per process of ``phase``; None where one was not measured."""

    def estimator(self, ctx: Context, phase: RegressionKind) -> str:
        """What one value is, in words (shown with the verdict)."""
        return f"{self.metric.value} per process"

    def measure(self, ctx: Context) -> list[MetricResult]:
        if self.metric not in ctx.workload.measure:
            return []
        return [self._judge(ctx, phase, self.values(ctx, phase)) for phase in self.phases
                if phase is RUN or ctx.compiled is not None]

    def _judge(self, ctx: Context, phase: RegressionKind, found: dict[str, list[tuple[int, float | None]]]
               ) -> MetricResult:
        groups = {side: [p for p, _ in found[side]] for side in SIDES}
        # the run's values come from the timed processes, whose fork servers are a level; the
        # compile's from fresh compiling processes (their positions are another sequence's)
        servers = contended.server_labels(ctx.timed, groups) if phase is RUN else {}
        values = {side: [v for _, v in found[side]] for side in SIDES}
        kept = {side: tuple(v for v in values[side] if v is not None) for side in SIDES}
        s = ctx.config.stats
        if any(v is None for side in SIDES for v in values[side]) or not all(kept.values()):
            why = f"{self.metric.value} was not measured for every process of this runner and workload"
            verdict = replace(stats.compare([], [], threshold_pct=self.threshold_pct(ctx.config)),
                              reason=f"not judged: {why}", unit=self.unit)
            return MetricResult(self.metric.value, phase.value, verdict, kept[CONTROL], kept[TREATMENT],
                                self.source, why)
        verdict = stats.compare(
            kept[CONTROL], kept[TREATMENT], threshold_pct=self.threshold_pct(ctx.config), alpha=s.alpha,
            confidence=s.confidence, resamples=s.bootstrap_resamples, seed=ctx.seed,
            control_groups=groups[CONTROL], treatment_groups=groups[TREATMENT],
            paired=True, equivalence_alpha=s.equivalence_alpha, min_samples=3, **servers)
        verdict = replace(verdict, unit=self.unit, estimator=f"{self.estimator(ctx, phase)}, paired by the "
                          "interleaved order", stop_reason="judged where the timing stopped")
        return MetricResult(self.metric.value, phase.value, verdict, kept[CONTROL], kept[TREATMENT], self.source)


def process_medians(samples: Sequence[float], groups: Sequence[int]) -> dict[int, float]:
    """Each process's median sample, by its position."""
    by: dict[int, list[float]] = {}
    for value, group in zip(samples, groups, strict=True):
        by.setdefault(group, []).append(value)
    return {group: statistics.median(values) for group, values in by.items()}
