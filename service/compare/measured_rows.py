"""The rows the registry's verdicts are stored as: a comparison's ``measurements`` (one per
metric and phase it judged) and a run's ``build_measurements`` (one per metric of its builds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from abwatch.service.compare.metrics import METRICS, RUN, Own, own_results
from abwatch.service.compare.outcome import MetricResult

from abwatch.service.stats.verdict import Metric, RegressionKind, Verdict
from abwatch.service.store.models import BuildMeasurement, MetricMeasurement


def rows(comparison_id: int, first: Metric, verdict: Verdict, failure: str | None, own: Own,
         beside: Sequence[MetricResult]) -> list[MetricMeasurement]:
    """The ``measurements`` rows of one comparison: its own verdict (``first``, the first metric
    of ``measure``: time, whose values are the samples, or instructions, whose are its counts),
    then what was measured in processes of its own (``metrics.measure_own``: the compile's time, the
    instructions of the run where not the first, and of the compile) and ``beside``."""
    on_own = own.get((first, RUN))
    head = MetricResult(first.value, RUN.value, verdict, (), (), "", failure)
    if on_own is not None:
        head = replace(METRICS[first].result(RUN, on_own), verdict=verdict, failure=failure)
    listed = [(head, on_own is not None), *((r, True) for r in own_results(own)
                                             if (Metric(r.metric), RegressionKind(r.phase)) != (first, RUN)),
              *((b, True) for b in beside)]
    return [MetricMeasurement(
        comparison_id=comparison_id, phase=RegressionKind(r.phase), metric=Metric(r.metric), unit=v.unit,
        verdict=v.verdict, change_pct=v.change_pct, ci_low_pct=v.ci_pct[0] if v.ci_pct else None,
        ci_high_pct=v.ci_pct[1] if v.ci_pct else None, p_value=v.p_value, control_value=v.control_median_ms,
        treatment_value=v.treatment_median_ms, control_values=list(r.control_values) if valued else None,
        treatment_values=list(r.treatment_values) if valued else None, source=r.source or None, failure=r.failure,
        judged=v.to_dict()) for r, valued in listed for v in [r.verdict]]


def build_rows(run_id: int, build_ids: tuple[int, int], judged: Sequence[MetricResult]) -> list[BuildMeasurement]:
    """The ``build_measurements`` rows of a run's verdicts on its builds."""
    return [BuildMeasurement(
        run_id=run_id, metric=Metric(r.metric), unit=r.verdict.unit, verdict=r.verdict.verdict,
        change_pct=r.verdict.change_pct, control_build_id=build_ids[0], treatment_build_id=build_ids[1],
        control_value=r.control_values[0] if r.control_values else None,
        treatment_value=r.treatment_values[0] if r.treatment_values else None, source=r.source or None,
        failure=r.failure, judged=r.verdict.to_dict()) for r in judged]
