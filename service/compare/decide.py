"""What one workload's judged measurement calls for: the decision of storing a comparison.

:func:`decide` takes what the measuring of one workload found (:class:`Found`: the verdict of
its first metric, every other metric's verdict of the run and of the compile, the output check)
and returns a :class:`Decision`: the regressions to open, each with its kind, the metric and
the verdict that found it, whether the outputs differ, and whether the run's samples may teach
the workload's noise profile. :mod:`service.compare.storing` writes what it says. Plain values:
no database, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from abwatch.runners.outputs import OutputDiff
from abwatch.service.stats.verdict import Metric, Outcome, RegressionKind, Verdict

# (metric, its verdict): one metric's judgement of one workload in one phase
MetricVerdict = tuple[Metric, Verdict]


@dataclass(frozen=True)
class Found:
    """What the measuring of one workload found, as far as the decision needs it."""

    workload: str
    measure: tuple[Metric, ...]  # the workload's metrics, in its ``measure`` order
    verdict: Verdict  # the comparison's own verdict: the first metric's, on the run
    run: tuple[MetricVerdict, ...]  # the other metrics' verdicts of the run (processes of their own, beside)
    compile: tuple[MetricVerdict, ...]  # the compile's verdicts, in the metric registry's order
    output: OutputDiff | None  # the output check of a TVM workload's first outputs; None: not checked
    benchmark: bool  # a benchmark run opens regressions; verify, bisection and tries only measure
    # the measured code is merged: only such a run's noise is learnt, since later runs of merged
    # code start from it (a try or pull-request job's code could steer their repetitions)
    trusted: bool = True


@dataclass(frozen=True)
class Opening:
    """A slowdown to open a regression for (or to note on the open one it is the same as)."""

    kind: RegressionKind
    metric: Metric  # the metric whose verdict found it
    verdict: Verdict  # that verdict
    reason: str | None  # the opening event's reason; None: the comparison's own verdict's


@dataclass(frozen=True)
class Decision:
    """What to write for one workload besides its comparison and measurements."""

    workload: str
    runtime: Opening | None
    compile_time: Opening | None
    correctness: str | None  # why a correctness regression is opened (no verdict judges outputs); None: none
    mismatch: bool  # the outputs differ (said whether or not the run may open a regression)
    learn_noise: bool  # a `same` verdict of merged code: its samples show the pair's noise, no change
    learn_counts: bool  # merged code, whatever its verdict: its processes show what their repetitions cost


def decide(found: Found) -> Decision:
    """The regressions ``found`` opens and what else it calls for.

    A benchmark run opens a ``runtime`` regression by the first metric of ``measure`` whose
    run verdict regressed; a ``compile-time`` one by the first compile verdict that regressed
    (the registry's order: wall time, instructions, peak memory); a ``correctness`` one when
    the outputs differ, whatever the speed says. Other runs open none: they re-measure pairs
    whose regressions are open already.
    """
    runtime = first_regression(found.measure, [(found.measure[0], found.verdict), *found.run])
    compiled = next(((metric, v) for metric, v in found.compile if v.verdict == Outcome.REGRESSION), None)
    mismatch = found.output is not None and found.output["mismatch"]
    return Decision(
        workload=found.workload,
        runtime=Opening(RegressionKind.RUNTIME, *runtime, reason=None) if runtime and found.benchmark else None,
        compile_time=(Opening(RegressionKind.COMPILE_TIME, *compiled, reason=_compile_reason(*compiled))
                      if compiled and found.benchmark else None),
        correctness=(mismatch_reason(found.output)
                     if found.output is not None and mismatch and found.benchmark else None),
        mismatch=mismatch,
        learn_noise=found.verdict.verdict == Outcome.SAME and found.trusted,
        learn_counts=found.trusted,
    )


def first_regression(measure: Sequence[Metric],
                     verdicts: Sequence[tuple[Metric, Verdict | None]]) -> MetricVerdict | None:
    """The verdict that opens a runtime regression: the first regression among ``verdicts`` in
    the workload's ``measure`` order (a metric it does not name comes last; of two verdicts of
    one metric, the earlier)."""
    rank = {Metric(m): i for i, m in enumerate(measure)}
    found = [(metric, v) for metric, v in verdicts if v is not None and v.verdict == Outcome.REGRESSION]
    return min(found, key=lambda mv: rank.get(mv[0], len(rank)), default=None)


def _compile_reason(metric: Metric, verdict: Verdict) -> str:
    what = "compile time" if metric is Metric.TIME else f"compile {metric.value.replace('_', ' ')}"
    return f"{what} {verdict.reason}"


def mismatch_reason(error: OutputDiff) -> str:
    """Why outputs that differ are a regression: by how much, against which tolerances, or the
    check's own reason where it has no error figures (another shape, non-finite values)."""
    if error["max_abs"] is None or error["max_rel"] is None:
        return f"outputs differ: {error['reason']}"
    return (f"outputs differ: max abs error {error['max_abs']:.3g}, max rel {error['max_rel']:.3g} "
            f"(rtol {error['rtol']:g}, atol {error['atol']:g})")
