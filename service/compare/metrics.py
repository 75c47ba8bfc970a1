"""The metric registry: ``METRICS``, one class per metric (named by ``core.metric_names.Metric``).

A metric class knows its unit, its default threshold, how it is measured for a workload (or
that it is measured elsewhere), and how verify and bisection read its verdict from a workload's
result. The driver, verify and bisection go through this registry instead of naming metrics:

- ``time``: wall time. The timed invocations (``driver``) and the fresh-process compiles
  (``compile_time``) are the measurement every other metric of the run rests on; its verdict is
  the comparison's own (or the compile's).
- ``instructions``: counted processes of their own (``instructions``), judged like time.
- ``cpu_time`` and ``max_rss``: judged from the timed processes themselves, one value per
  process, paired by the interleaved order (:class:`FromProcesses`): no process is added, and
  their verdicts rest on the confidence sequence (anytime-valid) at the point the timing stopped.
- ``code_size``: the library the first timed process of each side compiled, judged exactly
  (a deterministic quantity: one value a side, no repetitions).
- ``ttft``, ``decode_latency`` and ``tokens_per_s``: what mlc-llm's benchmark reports of a
  workload that generates tokens (``builtin:llm-decode``), one value per generation a timed
  process ran, judged like the run time (:class:`PerGeneration`); tokens per second is better
  higher, so its drop is the regression.

The classes they are made of (the context, the interface, judged beside the timing or per
process) are in :mod:`.metric_base`.

A new metric is one class here (its measuring, if the runners do not report it yet, goes to
``runners``) and its name in ``core.metric_names.Metric``. Every verdict is stored as a row of
``measurements``, a verdict on the builds as one of ``build_measurements``
(``service.compare.measured_rows``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from abwatch.core.metric_names import FROM_TIMED_PROCESSES, METRIC_NAMES, Metric
from abwatch.core.plugins import Registry
from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.service import stats
from abwatch.service.compare import compile_time, contended, instructions
from abwatch.service.compare.outcome import MetricResult, WorkloadResult
from abwatch.service.config import Config
from abwatch.service.stats.verdict import RegressionKind
from abwatch.service.compare.metric_base import (  # noqa: F401 - Context, Job, Own, COMPILE: re-exported
    COMPILE, RUN, SIDES, Beside, Context, FromProcesses, Job, Judged, Judgement, MetricKind, Own, process_medians,
)

class Time(MetricKind):
    """Wall time: the timed calls' samples (the driver's own loop), and the compile's own time
    in fresh processes (``service.compare.compile_time``)."""

    metric, unit, default_threshold_pct = Metric.TIME, "ms", 1.0

    def threshold_pct(self, config: Config) -> float:
        return config.stats.threshold_pct

    def own(self, job: Job) -> dict[RegressionKind, Judged | None]:
        return {COMPILE: compile_time.measure(job.runner, job.workload, job.artifacts, job.config, job.seed, job.rng,
                                              job.progress, job.timeout_s)}

    def result(self, phase: RegressionKind, judged: Judged) -> MetricResult:
        return replace(super().result(phase, judged), source="fresh process")

    def shown(self, phase: RegressionKind, judged: Judged) -> tuple[str, dict[str, Any], dict[str, Any]]:
        return "compile", compile_time.details(judged), {}  # a TVM workload's details (attribution)

    def said(self, phase: RegressionKind, judged: Judged) -> str:
        return f"compile time {judged.verdict.verdict.value} — {judged.verdict.reason}"

    def judged(self, result: WorkloadResult, phase: RegressionKind) -> Judgement:
        if phase is COMPILE:
            return compile_time.judged(result)
        return result.verdict, result.failure


class Instructions(MetricKind):
    """Instructions retired by counted processes of their own (``service.compare.instructions``)."""

    metric, unit, default_threshold_pct = Metric.INSTRUCTIONS, "instructions", 0.5

    def threshold_pct(self, config: Config) -> float:
        return config.stats.instructions_threshold_pct

    def own(self, job: Job) -> dict[RegressionKind, Judged | None]:
        return {phase: instructions.measure(job.runner, job.workload, job.artifacts, job.config, job.seed, job.rng,
                                            job.progress, job.timeout_s, what)
                for phase, what in ((RUN, "run"), (COMPILE, "compile"))}

    def shown(self, phase: RegressionKind, judged: Judged) -> tuple[str, dict[str, Any], dict[str, Any]]:
        whole = instructions.details(judged)
        return instructions.WHAT["compile" if phase is COMPILE else "run"], whole, {"profile": whole["profile"]}

    def said(self, phase: RegressionKind, judged: Judged) -> str:
        v = judged.verdict
        label = "compile instructions" if phase is COMPILE else "instructions"
        return f"{label} ({judged.source}) {v.verdict.value} — {v.reason}"

    def judged(self, result: WorkloadResult, phase: RegressionKind) -> Judgement:
        return instructions.judged_compile(result) if phase is COMPILE else instructions.judged(result)


class CpuTime(FromProcesses):
    """User + system CPU time: of each command process (wait4), of a TVM worker's timing batch
    per call (its CPU share over the batch times the process's median sample, all threads). On a
    contended host it moves far less than wall time (docs/statistics.md)."""

    metric, unit, default_threshold_pct, source = Metric.CPU_TIME, "cpu ms", 1.0, "rusage"
    record_field = "cpu_ms_median"

    def values(self, ctx: Context, phase: RegressionKind) -> dict[str, list[tuple[int, float | None]]]:
        per_call = WORKLOAD_KINDS[ctx.workload.kind].times_compiles  # a TVM worker: its timing batch
        found: dict[str, list[tuple[int, float | None]]] = {}
        for side in SIDES:
            medians = process_medians(ctx.timed.samples[side], ctx.timed.groups[side])
            found[side] = [(f.position, None if f.cpu_s is None else
                            (f.cpu_s / f.wall_s * medians[f.position] if per_call and f.wall_s > 0
                             else 1000.0 * f.cpu_s)) for f in ctx.timed.processes[side]]
        return found

    def estimator(self, ctx: Context, phase: RegressionKind) -> str:
        if WORKLOAD_KINDS[ctx.workload.kind].times_compiles:
            return "CPU ms per call (the timing batch's CPU share x the process's median sample)"
        return "CPU ms (user + system) per process"


class MaxRss(FromProcesses):
    """Peak resident memory: of each command process (wait4), of a TVM worker's timing batch
    (its high-water mark reset before the batch) and of each fresh-process compile."""

    metric, unit, default_threshold_pct, source = Metric.MAX_RSS, "KiB", 2.0, "rusage"
    record_field = "max_rss_kib_median"
    phases = (RUN, COMPILE)

    def values(self, ctx: Context, phase: RegressionKind) -> dict[str, list[tuple[int, float | None]]]:
        if phase is COMPILE:
            results = (ctx.compiled.results if ctx.compiled else None) or {CONTROL: [], TREATMENT: []}
            return {side: [(p, None if r.max_rss_kb is None else float(r.max_rss_kb)) for p, r in results[side]]
                    for side in SIDES}
        return {side: [(f.position, None if f.max_rss_kb is None else float(f.max_rss_kb))
                       for f in ctx.timed.processes[side]] for side in SIDES}

    def estimator(self, ctx: Context, phase: RegressionKind) -> str:
        return "peak resident KiB of each compile process" if phase is COMPILE else "peak resident KiB per process"


class CodeSize(Beside):
    """The size of what the compile produced: the ``.text`` bytes of the library a TVM
    workload's first timed process compiled and exported (``runners.code_size``). Deterministic:
    one library a side, judged exactly (:func:`stats.compare_exact`), no repetitions. A
    regression of it is a ``compile-time`` one."""

    metric, unit, default_threshold_pct = Metric.CODE_SIZE, "bytes", 1.0
    record_field = "code_text_bytes"

    def measure(self, ctx: Context) -> list[MetricResult]:
        if self.metric not in ctx.workload.measure:
            return []
        found = {side: next((m["code"] for m in ctx.timed.metrics[side] if m.get("code")), None) for side in SIDES}
        sizes = {side: (found[side] or {}).get("text_bytes") for side in SIDES}
        control, treatment = sizes[CONTROL], sizes[TREATMENT]
        if control is None or treatment is None:
            why = "no compiled library's code size was read (a tvm workload's ELF library only)"
            verdict = replace(stats.compare([], []), reason=f"not judged: {why}", unit=self.unit)
            return [MetricResult(self.metric.value, COMPILE.value, verdict, (), (), "elf .text", why)]
        verdict = stats.compare_exact(float(control), float(treatment), threshold_pct=self.threshold_pct(ctx.config),
                                      unit=self.unit)
        return [MetricResult(self.metric.value, COMPILE.value, verdict, (float(control),), (float(treatment),),
                             "elf .text")]


class PerGeneration(Beside):
    """A figure of each token generation a timed process ran (``builtin:llm-decode``: the
    worker's ``series``, one value per generation, as many as its samples), judged like the run
    time: each process by its best value, the control's i-th process paired with the treatment's
    i-th, on the anytime-valid confidence sequence where the timing stopped, at the run time's
    threshold unless ``[stats.thresholds]`` names the metric; and under heavy contention, as the
    run time's look, on the CPU time of each generation's phase (one thread), or refused (several).
    Its values are each process's best wall-clock figure."""

    source: ClassVar[str] = "generation"
    higher_is_better: ClassVar[bool] = False
    cpu_unit: ClassVar[str]  # its unit when judged on CPU time

    def threshold_pct(self, config: Config) -> float:
        return config.stats.thresholds.get(self.metric, config.stats.threshold_pct)

    def measure(self, ctx: Context) -> list[MetricResult]:
        if self.metric not in ctx.workload.measure:
            return []
        s = ctx.config.stats
        contention = contended.assessed(ctx.timed, ctx.config)
        processes = [f for side in SIDES for f in ctx.timed.processes[side]]
        on_cpu = contention.heavy and all(f.threads == 1 for f in processes)  # as contended.look decides
        found, wall = ({side: [(f.position, f.series.get(self.metric.value + clock)) for f in ctx.timed.processes[side]]
                        for side in SIDES} for clock in ("_cpu" if on_cpu else "", ""))
        if not all(found[side] and all(values for _, values in found[side] + wall[side]) for side in SIDES):
            why = f"{self.metric.value} was not reported by every process (a workload that generates tokens only)"
            verdict = replace(stats.compare([], [], threshold_pct=self.threshold_pct(ctx.config)),
                              reason=f"not judged: {why}", unit=self.unit, higher_is_better=self.higher_is_better)
            return [MetricResult(self.metric.value, RUN.value, verdict, (), (), self.source, why)]
        # every process reported (checked above): the Nones are gone
        samples = {side: [v for _, values in found[side] for v in values or ()] for side in SIDES}
        groups = {side: [p for p, values in found[side] for _ in values or ()] for side in SIDES}
        verdict = stats.compare(
            samples[CONTROL], samples[TREATMENT], threshold_pct=self.threshold_pct(ctx.config), alpha=s.alpha,
            confidence=s.confidence, resamples=s.bootstrap_resamples, seed=ctx.seed, control_groups=groups[CONTROL],
            treatment_groups=groups[TREATMENT], paired=True, equivalence_alpha=s.equivalence_alpha,
            higher_is_better=self.higher_is_better, **contended.server_labels(ctx.timed, groups))
        verdict = replace(verdict, unit=self.unit, stop_reason="judged where the timing stopped")
        if on_cpu:
            verdict = replace(stats.on_cpu_time(verdict, contention), unit=self.cpu_unit,
                              estimator=f"{verdict.estimator}; on each generation's CPU time")
        elif contention.heavy:
            verdict = stats.refused(verdict, contention, "processes ran on several threads, whose CPU time "
                                    "waiting inflates too")
        # the values kept (records, history) are the wall-clock figures, as the run time's samples are
        pick = max if self.higher_is_better else min
        best = {side: tuple(pick(values or ()) for _, values in wall[side]) for side in SIDES}
        return [MetricResult(self.metric.value, RUN.value, verdict, best[CONTROL], best[TREATMENT], self.source)]


class Ttft(PerGeneration):
    """Time to first token: the prefill of the prompt, one call (ms)."""

    metric, unit, default_threshold_pct, cpu_unit = Metric.TTFT, "ms", 1.0, stats.CPU_UNIT
    record_field = "ttft_ms"


class DecodeLatency(PerGeneration):
    """Per-token decode latency: the decode steps' time over the tokens they made (ms)."""

    metric, unit, default_threshold_pct, cpu_unit = Metric.DECODE_LATENCY, "ms", 1.0, stats.CPU_UNIT
    record_field = "decode_ms_per_token"


class TokensPerS(PerGeneration):
    """Decode throughput: tokens the decode steps made per second. Better higher: a drop is the
    regression, a rise the improvement."""

    metric, unit, default_threshold_pct, cpu_unit = Metric.TOKENS_PER_S, "tokens/s", 1.0, "tokens/cpu s"
    record_field = "decode_tokens_per_s"
    higher_is_better = True


class BinarySize(MetricKind):
    """The size of the build itself: its libraries as its builder names them
    (``Builder.binary_files``: a TVM build's ``libtvm*.so``, a command build's ``[build]
    binary_size`` globs), read when it was built and kept on its row (``builds.metrics``). One
    value a build: the ``.text`` bytes of its libraries, or their file bytes where they are no
    ELF files; judged exactly between a run's two builds, like the code size."""

    metric, unit, default_threshold_pct = Metric.BINARY_SIZE, "bytes", 1.0
    phase: ClassVar[str] = "build"  # of the builds, not of a workload's run or compile

    def measure_builds(self, control: Mapping[str, Any] | None, treatment: Mapping[str, Any] | None,
                       config: Config) -> MetricResult | None:
        sizes = [(found or {}).get(self.metric.value) for found in (control, treatment)]
        if sizes == [None, None]:
            return None  # the builder names no libraries (a command build without [build] binary_size)
        if None in sizes:
            why = f"the {SIDES[sizes.index(None)]}'s build has no libraries the builder names"
            verdict = replace(stats.compare([], []), reason=f"not judged: {why}", unit=self.unit)
            return MetricResult(self.metric.value, self.phase, verdict, (), (), "", why)
        known = [size for size in sizes if size is not None]  # both, checked above
        on_text = all(size.get("text_bytes") is not None for size in known)
        key, source = ("text_bytes", "elf .text") if on_text else ("file_bytes", "file bytes")
        values = [float(size[key]) for size in known]
        verdict = stats.compare_exact(values[0], values[1], threshold_pct=self.threshold_pct(config), unit=self.unit)
        return MetricResult(self.metric.value, self.phase, verdict, (values[0],), (values[1],), source)

    def judged(self, result: WorkloadResult, phase: RegressionKind) -> Judgement:
        why = "binary_size is judged between a run's builds, not per workload"
        return replace(stats.compare([], []), reason=f"not judged: {why}", unit=self.unit), why


# name -> metric, as BUILDERS and RUNNERS: the one place a metric is registered. Keyed by the
# ``Metric`` member (a str, so its name finds it too: ``METRICS["max_rss"]``), and only by a name
# of ``core.metric_names`` (``of``): a class whose name the config cannot write is refused.
METRICS: Registry[MetricKind] = Registry("metric", ((m.metric, m) for m in (
    Time(), Instructions(), CpuTime(), MaxRss(), CodeSize(), Ttft(), DecodeLatency(), TokensPerS(), BinarySize(),
)), of=METRIC_NAMES)
assert not METRICS.missing(), "every metric named in core.metric_names has its class here"


def measure(ctx: Context) -> list[MetricResult]:
    """Every verdict of the metrics judged from ``ctx``'s timed processes, in registry order."""
    return [r for name in FROM_TIMED_PROCESSES for r in METRICS[name].measure(ctx)]


def measure_builds(control: Mapping[str, Any] | None, treatment: Mapping[str, Any] | None,
                   config: Config) -> list[MetricResult]:
    """Every verdict of the metrics of the builds between a run's two builds (their rows'
    ``metrics``), in registry order."""
    return [r for kind in METRICS.values() if (r := kind.measure_builds(control, treatment, config)) is not None]


def record_fields(side: str, measured: Sequence[MetricResult]) -> dict[str, float]:
    """The v0.1 record's metrics of one side from ``measured``: each metric's median value under
    its ``record_field`` (``compilation_`` before it for the compile's)."""
    fields = {}
    for m in measured:
        values = m.control_values if side == CONTROL else m.treatment_values
        name = METRICS[m.metric].record_field
        if values and name:
            fields[("compilation_" if m.phase == COMPILE.value else "") + name] = statistics.median(values)
    return fields


def adjust(per_workload: Sequence[Sequence[MetricResult]]) -> list[list[MetricResult]]:
    """Benjamini-Hochberg across one run's workloads, each (metric, phase) a family of its own."""
    out = [list(results) for results in per_workload]
    families = sorted({(r.metric, r.phase) for results in out for r in results})
    for family in families:
        where = [(i, j) for i, results in enumerate(out) for j, r in enumerate(results)
                 if (r.metric, r.phase) == family and r.failure is None]
        adjusted = stats.adjust_fdr([out[i][j].verdict for i, j in where])
        for (i, j), verdict in zip(where, adjusted, strict=True):
            out[i][j] = replace(out[i][j], verdict=verdict)
    return out


def judged(result: WorkloadResult, phase: RegressionKind, metric: Metric) -> Judgement:
    """The verdict of ``metric`` in ``phase`` of a workload's result: what verify and bisection
    judge a regression by (the one that opened it)."""
    return METRICS[metric].judged(result, RegressionKind(phase))


def measure_own(job: Job) -> Own:
    """What every metric measures in processes of its own for one workload, in registry order
    (time's compiles, then the counted processes), each phase judged (None: not measured)."""
    return {(kind.metric, phase): judged for kind in METRICS.values() for phase, judged in kind.own(job).items()}


def adjust_own(per_workload: Sequence[Own]) -> list[Own]:
    """Benjamini-Hochberg across one run's workloads, each (metric, phase) of :func:`measure_own`
    a family of its own."""
    out = [dict(own) for own in per_workload]
    for family in dict.fromkeys(key for own in out for key in own):
        where = [i for i, own in enumerate(out) if own.get(family) is not None]
        adjusted = stats.adjust_fdr([out[i][family].verdict for i in where])
        for i, verdict in zip(where, adjusted, strict=True):
            out[i][family] = replace(out[i][family], verdict=verdict)
    return out


def own_results(own: Own) -> list[MetricResult]:
    """The verdicts of :func:`measure_own` (those measured), in registry order."""
    return [METRICS[metric].result(phase, j) for (metric, phase), j in own.items() if j is not None]


def own_verdicts(own: Own, phase: RegressionKind) -> list[tuple[Metric, stats.Verdict]]:
    """(metric, verdict) of each metric measured in processes of its own in ``phase``, in registry order."""
    return [(metric, j.verdict) for (metric, p), j in own.items() if p is phase and j is not None]
