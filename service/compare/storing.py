"""Storing one workload's judged measurement: what :func:`service.compare.decide.decide` says, written.

:func:`store_result` writes the workload's comparison and a ``measurements`` row per metric,
opens the regressions the decision names (a runtime one, a compile-time one, a correctness
one), lets a `same` verdict teach the noise profile, writes the records, commits, and says
what it did. Which regressions a measurement calls for is decided apart from all this
(:mod:`service.compare.decide`), where it can be tested without a database.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from abwatch.builders import sandbox
from abwatch.core.device_identity import DeviceInfo
from abwatch.core.metric_names import SHOWN_APART
from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners import WORKLOAD_KINDS
from abwatch.runners.harness import Measurement
from abwatch.service import stats
from abwatch.service.compare import attribution, compile_time, contended, decide, lifecycle, measured_rows
from abwatch.service.compare import metrics, noise
from abwatch.service.compare.attribution import TvmDetails
from abwatch.service.compare.outcome import MetricResult, WorkloadResult, verdict_json
from abwatch.service.compare.progress import Progress
from abwatch.service.compare.run_records import write_records
from abwatch.service.config import Config, WorkloadSpec
from abwatch.service.stats.verdict import Metric, RegressionKind
from abwatch.service.store.models import DETAILS_VERSION, Comparison, Regression, Run, RunType
from abwatch.service.store.rows import get_workload

# Given the run, the comparison, the regression kind and the least change (%) the run's evidence
# allows (its confidence interval's lower end), the open regression this slowdown is the same as
# (the watch's pinned-base mode), or None to open a new one.
Attach = Callable[[Session, Run, Comparison, RegressionKind, float], Regression | None]

# where a metric of processes of its own is shown under a key of its own: (key, whole object,
# what comparisons.details keeps of it) by (metric, phase)
Shown = tuple[dict[str, dict], dict[str, dict], dict[tuple[Metric, RegressionKind], str]]


def store_result(session: Session, config: Config, run: Run, workload: WorkloadSpec,
                 m: Measurement, verdict: stats.Verdict, device_info: DeviceInfo, progress: Progress,
                 own: metrics.Own, attach: Attach | None = None,
                 beside: tuple[MetricResult, ...] = ()) -> WorkloadResult:
    """Store the comparison and a ``measurements`` row per metric, open the regressions the
    decision names (speed by the first metric of ``measure`` that regressed, compile time,
    output), learn the noise of a `same` verdict, write the records; commit."""
    row = get_workload(session, run.repository_id, workload.name, workload.kind, workload.model_dump(mode="json"))
    error = WORKLOAD_KINDS[workload.kind].check_outputs(workload, m.metrics) if m.failure is None else None
    extra = attribution.tvm_details(m.metrics, error) if error is not None else None
    shown, kept, keys = _shown(own, workload.name, progress)
    if extra is not None and "compile" in shown:  # a compile is shown with a TVM workload's details
        extra["compile"] = shown["compile"]
    contention = contended.assessed(m, config)
    measured = {"contention": contention.to_dict()} if contention.cpu_share is not None else {}
    comparison = _comparison(run, row.id, m, verdict, measured, extra, kept)
    session.add(comparison)
    session.flush()
    first = Metric(workload.measure[0])
    session.add_all(measured_rows.rows(comparison.id, first, verdict, m.failure, own, beside))
    decision = decide.decide(decide.Found(
        workload.name, tuple(Metric(x) for x in workload.measure), verdict,
        run=(*metrics.own_verdicts(own, metrics.RUN), *_beside(beside, metrics.RUN)),
        compile=(*metrics.own_verdicts(own, metrics.COMPILE), *_beside(beside, metrics.COMPILE)),
        output=extra["error"] if extra is not None else None, benchmark=run.run_type == RunType.BENCHMARK,
        trusted=not sandbox.running_untrusted()))
    regression_id = _open_runtime(session, run, comparison, decision.runtime, attach, progress, workload.name)
    compile_id = None
    if (slower := decision.compile_time) is not None:
        compile_id = compile_time.open_slower(session, run, comparison, slower.metric, slower.verdict,
                                              slower.reason, attach)
        if (key := keys.get((slower.metric, metrics.COMPILE))) in shown:
            shown[key]["regression_id"] = compile_id  # the compile's verdict that opened it says so
            kept[key] = {**kept[key], "regression_id": compile_id}
            comparison.details = {**comparison.details, key: kept[key]}  # a new dict, so the JSON column sees it
    for b in beside:
        progress.message(f"  {workload.name}: {b.metric} ({b.phase}) {b.verdict.verdict.value} — {b.verdict.reason}")
    if decision.mismatch and extra is not None:
        progress.message(f"  {workload.name}: OUTPUT MISMATCH max_abs={extra['error']['max_abs']} "
                         f"max_rel={extra['error']['max_rel']}")
    correctness_id = None
    if decision.correctness is not None:  # a wrong answer is its own regression, whatever the speed verdict says
        correctness_id = lifecycle.open_regression(session, run, comparison, kind=RegressionKind.CORRECTNESS,
                                                   reason=decision.correctness).id
    if decision.learn_counts and m.failure is None:  # its noise only where `same`: see noise.learn
        judged, groups, typical = contended.judged_samples(m, verdict)  # CPU time where judged so
        noise.learn(session, row.id, run.device_id, judged, groups, run_id=run.id,
                    configured_samples=getattr(workload, "samples", None),  # a TVM workload's own
                    servers=contended.server_labels(m, groups), configured_children=config.runner.children_per_server,
                    servers_ahead=config.runner.servers_ahead, typical=typical, same=decision.learn_noise)
    counts, compile_counts = shown.get("instructions"), shown.get("compile_instructions")
    # a metric of processes of its own shown with the others (none of today's: time and instructions have keys)
    others = tuple(r for r in metrics.own_results(own) if Metric(r.metric) not in SHOWN_APART)
    write_records(session, config, run, workload, m, device_info, extra, counts, compile_counts, beside + others)
    session.commit()
    progress.message(f"  {workload.name}: {verdict.verdict.value} — {verdict.reason}")
    return WorkloadResult(workload.name, verdict, comparison.id, regression_id, m.failure,
                          correctness_id, extra, workload_id=row.id, instructions=counts,
                          compile_instructions=compile_counts, contention=measured.get("contention"),
                          measured=beside + others)


def _shown(own: metrics.Own, workload: str, progress: Progress) -> Shown:
    """What the registry's metrics of their own processes show under keys of their own (compile,
    instructions, compile_instructions), whole; what of each ``comparisons.details`` keeps (only
    what their measurements rows do not hold: the profiles, the compile-time regression opened);
    and the key of each (metric, phase). Each measured one's progress line is said."""
    shown: dict[str, dict] = {}
    kept: dict[str, dict] = {}
    keys: dict[tuple[Metric, RegressionKind], str] = {}
    for (metric, phase), j in own.items():
        if j is not None and (found := metrics.METRICS[metric].shown(phase, j)) is not None:
            keys[metric, phase], shown[found[0]], kept[found[0]] = found
        if j is not None:
            progress.message(f"  {workload}: {metrics.METRICS[metric].said(phase, j)}")
    return shown, kept, keys


def _comparison(run: Run, workload_id: int, m: Measurement, verdict: stats.Verdict, measured: dict,
                extra: TvmDetails | None, kept: dict[str, dict]) -> Comparison:
    """The comparison row of one workload (not yet added): its verdict, figures and details
    (``measured``: the contention; ``extra``: a TVM workload's; ``kept``: see :func:`_shown`)."""
    timed = verdict.unit != "instructions"  # on CPU time too, the plain medians are the timing samples
    return Comparison(
        run_id=run.id, workload_id=workload_id, verdict=verdict.verdict,
        change_pct=verdict.change_pct,
        ci_low_pct=verdict.ci_pct[0] if verdict.ci_pct else None,
        ci_high_pct=verdict.ci_pct[1] if verdict.ci_pct else None,
        # the ms columns hold times only: a row decided on instructions keeps its counts in measurements
        p_value=verdict.p_value, control_median_ms=verdict.control_median_ms if timed else None,
        treatment_median_ms=verdict.treatment_median_ms if timed else None,
        control_fastest_ms=stats.fastest_median(m.samples[CONTROL], m.groups[CONTROL]),
        treatment_fastest_ms=stats.fastest_median(m.samples[TREATMENT], m.groups[TREATMENT]),
        control_n=len(m.samples[CONTROL]), treatment_n=len(m.samples[TREATMENT]),
        error=m.failure,
        details={"version": DETAILS_VERSION, "verdict": verdict.to_dict(), **measured,
                 **({k: v for k, v in extra.items() if k != "compile"} if extra else {}),
                 **{key: value for key, value in kept.items() if value}},
    )


def _beside(beside: tuple[MetricResult, ...], phase: RegressionKind) -> list[decide.MetricVerdict]:
    """(metric, verdict) of each metric judged beside the timed processes in ``phase``."""
    return [(Metric(b.metric), b.verdict) for b in beside if b.phase == phase.value]


def _open_runtime(session: Session, run: Run, comparison: Comparison, opening: decide.Opening | None,
                  attach: Attach | None, progress: Progress, workload: str) -> int | None:
    """Open the runtime regression ``opening`` names (or note it on the open one ``attach``
    finds it the same as); its id, None when there is none to open."""
    if opening is None:
        return None
    regression = lifecycle.open_or_attach(session, run, comparison, RegressionKind.RUNTIME, opening.verdict, attach,
                                          metric=opening.metric)
    if regression.run_id == run.id:  # opened now; a re-run of the pair finds the open one
        regression.benchmark_verdict = {**verdict_json(opening.verdict, run.id), "metric": opening.metric.value}
    else:
        progress.message(f"  {workload}: regression {regression.id} (run {regression.run_id}) "
                         "is open for this pair (or is this slowdown, seen again) already")
    return regression.id
