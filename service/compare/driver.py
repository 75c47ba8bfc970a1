"""The A/B driver: resolve two refs, build both, run them interleaved, judge, store.

:func:`run_compare` is the one path a comparison takes (``compare``, verify, the watch and
bisection all call it): it resolves the refs, stores the run, builds the pair
(:func:`service.compare.building.build_pair`) and measures it (:func:`measure_pair`; what each
workload's verdicts call for is :mod:`service.compare.decide`'s, written by
:mod:`service.compare.storing`). The builder and runner are the config's unless the caller
passes its own (a watch worker keeps one runner for many runs).
:func:`service.compare.verify.run_verify` re-runs the pair of a benchmark run's suspected
regressions through it.

Transactions are short and the driver commits them itself, at the points where a reader
(or the next command, after a kill) must see progress: run started, each build, each
invocation, each workload judged, run finished. No transaction stays open while a build
or a workload process runs.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable, Mapping

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from abwatch.core.redact import mask_url
from abwatch.core.device_identity import DeviceInfo
from abwatch.core.sides import CONTROL, TREATMENT, Side
from abwatch.builders import Builder, make_builder
from abwatch.runners import Runner, make_runner
from abwatch.runners.duet import Cores, host_cores, measure_duet
from abwatch.runners.harness import Measurement, interleaved_schedule, measure
from abwatch.service import stats
from abwatch.service.compare import contended, infra, liveness
from abwatch.service.compare import measured_rows, metrics, noise
from abwatch.service.notify import alerts
from abwatch.service.store import locks
from abwatch.service.compare.building import build_pair
from abwatch.service.compare.outcome import (
    CompareOutcome, DriverError, MetricResult, WorkloadResult, build_result,
)
from abwatch.service.config import Config, WorkloadSpec
from abwatch.service.store.models import (
    Build, BuildMeasurement, Comparison, Invocation, InvocationStatus, Run, RunStatus, RunType, Workload, utcnow,
)
from abwatch.service.stats.verdict import Metric
from abwatch.service.compare.progress import MEASURED, MEASURING, RUN, NullProgress, Progress, Stage, stage
from abwatch.service.compare.schedule import schedule_for
from abwatch.service.compare.storing import Attach, store_result
from abwatch.service.store.rows import (
    device_note, earlier_series, get_commits, get_repository, get_workload, seen_device, write_samples,
)

MAX_REF_LENGTH = 256  # the refs' column width


def engine_of(session: Session) -> Engine:
    """The engine behind ``session`` (helpers that write in their own transactions use it)."""
    bind = session.get_bind()
    return bind if isinstance(bind, Engine) else bind.engine


def masked_config(config: Config) -> dict:
    """The config as stored with a run: JSON, with no secret in it: credentials in the
    repository URL masked, webhooks by their labels (a webhook's URL is its secret)."""
    data = config.model_dump(mode="json")
    if data.get("repo"):  # configs of release wheels have no repository
        data["repo"]["url"] = mask_url(data["repo"]["url"])
    data["alerts"]["webhooks"] = [alerts.label(w) for w in data["alerts"]["webhooks"]]
    return data


def run_compare(
    session: Session,
    config: Config,
    control_ref: str,
    treatment_ref: str,
    *,
    run_type: RunType = RunType.BENCHMARK,
    parent_run_id: int | None = None,
    progress: Progress | None = None,
    on_started: Callable[[Run], None] | None = None,
    builder: Builder | None = None,
    runner: Runner | None = None,
    attach: Attach | None = None,
) -> CompareOutcome:
    """One A/B run of ``treatment_ref`` against ``control_ref``, stored in full.

    ``on_started(run)`` is called once the run row is committed (verify moves its
    regressions to ``verify`` there, naming the run that verifies them). ``builder`` and
    ``runner`` default to those ``config`` names; a runner passed in is prepared here (its
    device description goes on the run) and left to its owner to tear down. ``attach`` finds
    the open regression a slowdown is the same as (then it is noted there, not opened again).
    """
    progress = progress or NullProgress()
    _refuse_bad_input(config, control_ref, treatment_ref)
    builder = builder if builder is not None else make_builder(config)
    control, treatment = builder.resolve(control_ref), builder.resolve(treatment_ref)
    owned = runner is None
    runner = runner if runner is not None else make_runner(config)
    try:
        device_info = runner.prepare()
        run = _start_run(session, config, builder.repository_url, device_info,
                         {Side.CONTROL: (control_ref, control), Side.TREATMENT: (treatment_ref, treatment)},
                         run_type, parent_run_id, progress)
        try:
            if on_started is not None:
                on_started(run)
            # both artifacts stay whole and in the cache until the run ends
            with ExitStack() as held, liveness.Heartbeat(engine_of(session), run.id):
                pair = build_pair(session, builder, run, {Side.CONTROL: (control_ref, control),
                                                          Side.TREATMENT: (treatment_ref, treatment)}, held, progress)
                if not pair.ok:  # build_pair finished the run as build_failed
                    return CompareOutcome(run.id, run_type.value, run.status.value, pair.builds)
                results = measure_pair(session, config, runner, run, device_info, pair.paths, progress, attach)
                judged = session.scalars(select(BuildMeasurement).where(BuildMeasurement.run_id == run.id)
                                         .order_by(BuildMeasurement.id))
                return CompareOutcome(run.id, run_type.value, run.status.value, pair.builds, results,
                                      tuple(build_result(row) for row in judged))
        except BaseException as exc:
            _end_stopped(session, run, exc, progress)
            raise
    finally:
        if owned:
            runner.teardown()


def _refuse_bad_input(config: Config, control_ref: str, treatment_ref: str) -> None:
    """Everything that can fail on bad input, refused before the first row is written."""
    for ref in (control_ref, treatment_ref):
        if len(ref) > MAX_REF_LENGTH:
            raise DriverError(f"ref {ref[:40]!r}... is {len(ref)} characters long; at most {MAX_REF_LENGTH}")
    if config.run.schedule == "duet":
        host_cores()  # a host with too few CPUs for a duet is refused before anything is built


def _start_run(session: Session, config: Config, repository_url: str, device_info: DeviceInfo,
               refs: Mapping[Side, tuple], run_type: RunType, parent_run_id: int | None,
               progress: Progress) -> Run:
    """Store the run (``refs``: each side's ref as given and as resolved), its commits and its
    device, claimed by this process and committed, and say so."""
    (control_ref, control), (treatment_ref, treatment) = refs[Side.CONTROL], refs[Side.TREATMENT]
    seed = config.run.seed if config.run.seed is not None else random.SystemRandom().randrange(2**31)
    repository = get_repository(session, repository_url)
    commits = get_commits(session, repository, [control, treatment])
    device, before = seen_device(session, device_info)
    changed = device_note(session, device, before)  # another fingerprint: never compared silently
    run = Run(
        run_type=run_type, status=RunStatus.RUNNING, repository_id=repository.id,
        control_ref=control_ref, treatment_ref=treatment_ref,
        control_commit_id=commits[control.sha].id, treatment_commit_id=commits[treatment.sha].id,
        device_id=device.id, parent_run_id=parent_run_id,
        seed=seed, config=masked_config(config),
    )
    liveness.claim(run)
    session.add(run)
    session.commit()
    progress.message(f"run {run.id} ({run_type.value}): {control_ref} -> {treatment_ref}")
    stage(progress, Stage(RUN, run_type.value, run_id=run.id))
    if changed:
        progress.message(f"  {changed}")
    return run


def _end_stopped(session: Session, run: Run, exc: BaseException, progress: Progress) -> None:
    """Whatever stopped the run (Ctrl-C, SIGTERM, a bug), it must not stay 'running' forever;
    every invocation that finished is committed already and stays."""
    session.rollback()
    if isinstance(exc, KeyboardInterrupt):
        run.status, run.error = RunStatus.INTERRUPTED, f"interrupted ({exc or 'SIGINT'})"
    else:
        run.status, run.error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
    run.finished_at = utcnow()
    session.commit()
    progress.message(f"run {run.id} {run.status.value}; the invocations it finished are kept")


def measure_pair(session: Session, config: Config, runner: Runner, run: Run, device_info: DeviceInfo,
                 artifacts: Mapping[Side, Path], progress: Progress | None = None,
                 attach: Attach | None = None) -> list[WorkloadResult]:
    """Measure every workload of ``config`` on the built pair, judge, store, and finish ``run``.

    ``run`` is stored with both build ids; ``artifacts`` are the built sides' directories,
    held by the caller until this returns. The measuring holds the device's lock (builds
    run without it). The run ends ``completed``, or ``incomplete`` when a workload could
    not be judged.
    """
    progress = progress or NullProgress()
    for path in artifacts.values():  # a build the device cannot run at all is refused, not timed as failing
        runner.check_build(path)
    judge_builds(session, config, run, progress)
    rng = random.Random(run.seed)
    cores = host_cores(config.run.schedule) if config.run.schedule != "interleaved" else None
    if cores is not None and cores.warning:
        progress.message(f"warning: {cores.warning}")
    device = device_info.name
    # Two measurements on one device at once corrupt each other: one measuring phase per
    # device, whichever process.
    with locks.device_lock(engine_of(session), device, f"abwatch run {run.id}", config.cache_dir / "locks",
                           on_wait=lambda who: progress.message(f"device {device} is busy, measured by {who}; "
                                                                "waiting for it")):
        measured = []
        stage(progress, Stage(MEASURING, total=len(config.workloads)))
        for done, workload in enumerate(config.workloads, 1):
            measured.append(_measure_metrics(session, config, run, runner, workload, artifacts, rng, progress, cores))
            _, m, verdict, own, _ = measured[-1]
            stage(progress, Stage(MEASURED, _said(m, verdict, own, workload), workload=workload.name, done=done,
                                  total=len(config.workloads)))
    # each metric is a family of its own for Benjamini-Hochberg
    timed = iter(stats.adjust_fdr([verdict for _, _, verdict, *_ in measured if verdict is not None]))
    owns = metrics.adjust_own([own for *_, own, _ in measured])
    besides = metrics.adjust([beside for *_, beside in measured])
    results = []
    for (workload, m, verdict, *_), own, beside in zip(measured, owns, besides, strict=True):
        if verdict is not None:
            verdict = next(timed)
        first = own.get((Metric(workload.measure[0]), metrics.RUN))
        if first is not None:  # the first metric was measured in processes of its own (instructions)
            verdict = first.verdict
            m = replace(m, failure=first.failure)
        assert verdict is not None
        results.append(store_result(session, config, run, workload, m, verdict, device_info, progress, own,
                                    attach, tuple(beside)))
    _finish(session, run, results)
    return results


def _measure_metrics(session: Session, config: Config, run: Run, runner: Runner, workload: WorkloadSpec,
                     artifacts: Mapping[Side, Path], rng: random.Random, progress: Progress,
                     cores: Cores | None) -> tuple:
    """Measure one workload's every metric on the pair: its timed invocations, what each metric
    measures in processes of its own, and what the timed processes report beside their time.
    Returns ``(workload, measurement, time verdict or None, own, beside)``, judged alone yet
    (:func:`measure_pair` adjusts each metric's family across the workloads)."""
    timeout = workload.timeout_s or config.run.timeout_s
    if Metric.TIME.value in workload.measure:
        m, verdict = _measure_workload(session, config, run, runner, workload, artifacts, rng, progress, cores)
    else:  # counted only: no timed invocations
        m, verdict = Measurement({CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []},
                                 {CONTROL: [], TREATMENT: []}), None
    # what each metric measures in processes of its own (the compiles, the counted processes)
    own = {} if m.failure else metrics.measure_own(
        metrics.Job(runner, workload, artifacts, config, run.seed, rng, progress, timeout))
    failures = [f for f in (m.failure, *(x.failure for x in own.values() if x)) if f]
    if failures:  # a full disk fails a workload's processes too; that is no verdict on the commit
        infra.check_measuring(workload.name, failures[0], config.cache_dir, config.cache)
    # the metrics of the timed processes themselves (CPU time, peak memory): no process more
    beside = [] if m.failure else metrics.measure(metrics.Context(
        workload, config, m, own.get((Metric.TIME, metrics.COMPILE)), run.seed))
    return workload, m, verdict, own, beside


def _finish(session: Session, run: Run, results: list[WorkloadResult]) -> None:
    """End ``run``: ``completed``, or ``incomplete`` naming the workloads that could not be judged (committed)."""
    unjudged = [r.workload for r in results if r.failure]
    run.status = RunStatus.INCOMPLETE if unjudged else RunStatus.COMPLETED
    if unjudged:
        run.error = f"not judged (no valid samples): {', '.join(unjudged)}"
    run.finished_at = utcnow()
    session.commit()


def _said(m: Measurement, verdict: stats.Verdict | None, own: dict, workload: WorkloadSpec) -> str:
    """A workload's verdict as measured, before the false-discovery adjustment (or why none)."""
    first = own.get((Metric(workload.measure[0]), metrics.RUN))
    if first is not None:
        verdict, failure = first.verdict, first.failure
    else:
        failure = m.failure
    if failure:
        return "not judged"
    if verdict is None:
        return "measured"
    change = f" {verdict.change_pct:+.2f}%" if verdict.change_pct is not None else ""
    return f"{verdict.verdict.value}{change}"


def judge_builds(session: Session, config: Config, run: Run, progress: Progress) -> list[MetricResult]:
    """Judge the metrics of the builds themselves (``binary_size``) between the run's two builds,
    from the sizes kept on their rows, and store a ``build_measurements`` row each (committed).
    A run judged already (a worker measuring again after a restart) keeps its rows."""
    if session.scalar(select(BuildMeasurement.id).where(BuildMeasurement.run_id == run.id).limit(1)) is not None:
        return []
    ids = (run.control_build_id, run.treatment_build_id)
    builds = [b for b in (session.get(Build, i) for i in ids if i is not None) if b is not None]
    if len(builds) != 2:
        return []
    control, treatment = (b.metrics for b in builds)
    judged = metrics.measure_builds(control, treatment, config)
    session.add_all(measured_rows.build_rows(run.id, (builds[0].id, builds[1].id), judged))
    session.commit()
    for r in judged:
        progress.message(f"builds: {r.metric.replace('_', ' ')} ({r.source or 'not read'}) {r.verdict.verdict.value}"
                         f" — {r.failure or r.verdict.reason}")
    return judged


def _measure_workload(session: Session, config: Config, run: Run, runner: Runner,
                      workload: WorkloadSpec, artifacts: Mapping[Side, Path],
                      rng: random.Random,
                      progress: Progress, cores: Cores | None = None) -> tuple[Measurement, stats.Verdict]:
    """Run interleaved batches until the verdict is decided or the budget is spent.

    Every invocation and raw sample is stored as it happens. After each batch the stopping
    rule (:func:`stats.sequential_look`, an anytime-valid confidence sequence) judges the
    pairs so far and says whether to stop and how many pairs the next batch may have within
    ``run.max_seconds`` and the optional ``run.max_repetitions``. Under ``run.schedule =
    "duet"`` or ``"duet-one-cpu"`` (on ``cores``) each pair's two processes run at once
    (:mod:`service.compare.schedule` says which workloads stay interleaved); the verdict's
    ``stop_reason`` then says the schedule it ran on.
    """
    row = _series_of(session, run, workload, progress)
    timeout = workload.timeout_s or config.run.timeout_s
    budget = stats.Budget(max_seconds=config.run.max_seconds, max_pairs=config.run.max_repetitions,
                          batch=config.run.step)
    planned = [0]  # invocations announced to the progress bar so far
    store = _invocation_writer(session, run, row.id, workload.name, progress, planned)
    paths = {side.value: path for side, path in artifacts.items()}
    started = time.monotonic()
    start, workload, first, why_samples = _first_look(session, config, run, row.id, workload, progress)
    how = schedule_for(config.run.schedule, cores, memory_bound=workload.memory_bound,
                       pinnable=runner.kind_of(workload).runs_pinned, kind=workload.kind)
    threads = contended.threads_note(config, workload, duet=how.cores is not None)
    for note in (how.note, threads):
        if note:
            progress.message(f"  {workload.name}: {note}")

    def noted(verdict: stats.Verdict) -> stats.Verdict:  # the schedule and the threads, after why it stopped
        return replace(verdict, stop_reason="; ".join(x for x in (verdict.stop_reason, how.note, why_samples, threads)
                                                      if x))

    schedule = interleaved_schedule(start, config.run.warmup, rng)
    measurement, look = None, 0
    while True:
        planned[0] += len(schedule)
        measured = first if look == 0 else workload  # the first look's servers may serve fewer children
        if how.cores is not None:  # the pairs' two sides at once (runners.duet)
            measurement = measure_duet(runner, paths, measured, schedule, timeout, store, how.cores, into=measurement)
        else:
            measurement = measure(runner, paths, measured, schedule, timeout, store, into=measurement)
        session.commit()
        look += 1
        if measurement.failure is not None:
            progress.message(f"  {workload.name}: {measurement.failure}")
            verdict = replace(stats.compare([], [], threshold_pct=config.stats.threshold_pct),
                              reason=f"not judged: {measurement.failure}")
            return measurement, noted(replace(verdict, stop_reason="invocation failed", looks=look,
                                              elapsed_s=time.monotonic() - started))
        # on wall time, or on CPU time per process under heavy contention (service.compare.contended)
        step = contended.look(measurement, config, look=look, elapsed_s=time.monotonic() - started, budget=budget,
                              seed=run.seed, plan_pairs=max(start, stats.DEFAULT_PLAN_PAIRS),  # fixed before any data
                              one_cpu=how.cores is not None and how.cores.one_cpu)
        if step.stop:
            progress.invocation(workload.name, planned[0], planned[0])
            return measurement, noted(step.verdict)
        progress.message(f"  {workload.name}: look {look}: {step.verdict.reason}; adding {step.next_pairs} pairs")
        schedule = interleaved_schedule(step.next_pairs, 0, rng, start=schedule[-1].position + 1)


def _first_look(session: Session, config: Config, run: Run, workload_id: int, workload: WorkloadSpec,
                progress: Progress) -> tuple[int, WorkloadSpec, WorkloadSpec, str]:
    """The first look's processes a side, the workload as it is measured (a TVM workload's
    samples a process and children a fork server, where its noise history chose them) and as
    its first look measures it (its fork servers serving no more children than leave that look
    an interval), each said; and why those (for the verdict's ``stop_reason``; empty: the
    workload's own)."""
    floor = config.run.repetitions if run.run_type == RunType.VERIFY else None
    start, why = noise.starting_repetitions(session, config, workload_id, run.device_id, floor)
    samples, why_samples = noise.samples_per_process(session, config, workload, workload_id, run.device_id)
    children, why_children = noise.children_per_server(session, config, workload, workload_id, run.device_id)
    cap = config.run.max_repetitions
    children, why_children = _children_within(config, workload, children, why_children, cap, (
        f"at most {cap} processes a side: {stats.MIN_BLOCKS} server pairs of two are needed for an interval"))
    at_first, why_first = _children_within(config, workload, children, "", start, (
        f"for the first look's {start} pairs, {stats.MIN_BLOCKS} server pairs of two for an interval there"))
    session.commit()  # nothing stays open while the workload's processes run
    progress.message(f"  {workload.name}: {why}")
    for said in (why_samples, why_children, why_first):
        if said:
            progress.message(f"  {workload.name}: {said}")
    # measured so; stored under the workload's own series (neither is part of its spec's identity)
    if samples is not None:
        workload = workload.model_copy(update={"samples": samples})
    if children is not None:
        workload = workload.model_copy(update={"children_per_server": children})
    first = workload.model_copy(update={"children_per_server": at_first}) if why_first else workload
    return start, workload, first, "; ".join(x for x in (why_samples, why_children, why_first) if x)


def _children_within(config: Config, workload: WorkloadSpec, children: int | None, why: str,
                     pairs: int | None, because: str) -> tuple[int | None, str]:
    """The children a fork server (None: the runner's) fitted to ``pairs`` processes a side (the
    run's cap, ``run.max_repetitions``, or its first look's), so that those pairs still reach the
    server pairs an interval needs (:func:`stats.children_within`), and why (``because``); as
    they were where the workload sets its own count, its workers are not forked, or no
    ``pairs`` limit them, or too few for any count to reach those server pairs."""
    if (pairs is None or pairs < 2 * stats.MIN_BLOCKS or config.runner.processes != "forked"
            or config.runner.kind != "cpu"  # a GPU's and a board's workers start fresh
            or getattr(workload, "children_per_server", 0) is not None):  # set, or not a TVM workload
        return children, why
    fitted = stats.children_within(pairs)
    if fitted >= (children or config.runner.children_per_server):
        return children, why
    return fitted, f"{fitted} children a fork server ({because})"


def _series_of(session: Session, run: Run, workload: WorkloadSpec, progress: Progress) -> Workload:
    """The workload's row (its series), saying so when its spec changed and a new series starts."""
    row = get_workload(session, run.repository_id, workload.name, workload.kind, workload.model_dump(mode="json"))
    earlier = earlier_series(session, row)
    if earlier is not None and not session.scalar(select(Comparison.id).where(Comparison.workload_id == row.id).limit(1)):
        progress.message(f"  {workload.name}: its spec changed (workload {earlier.id} -> {row.id}, spec "
                         f"{earlier.spec_hash[:12]} -> {row.spec_hash[:12]}); a new series starts")
    return row


def _invocation_writer(session: Session, run: Run, workload_id: int, name: str, progress: Progress,
                       planned: list[int]) -> Callable:
    """What the harness calls with each finished invocation: it stores the invocation and its raw
    samples and commits them, then moves the progress bar (``planned[0]``: invocations announced)."""
    order, done = iter(range(10**9)), iter(range(1, 10**9))

    def store(slot, result) -> None:
        side = Side(slot.side)
        invocation = Invocation(
            run_id=run.id, workload_id=workload_id, side=side, position=slot.position, warmup=slot.warmup,
            status=InvocationStatus(result.status), wall_s=result.wall_s, message=result.message,
            cpu_s=result.cpu_s, involuntary_switches=result.involuntary_switches,
            usage_wall_s=None if result.cpu_s is None else result.usage_span_s,
            max_rss_kb=result.max_rss_kb, server=result.server, server_start_s=result.server_start_s,
        )
        session.add(invocation)
        session.flush()
        # raw samples go through the bulk path (COPY on PostgreSQL): they are most of the data
        cpu = result.cpu_samples or (None,) * len(result.samples)
        write_samples(session, [(invocation.id, run.id, workload_id, side.value, next(order), value, slot.warmup, ms)
                                for value, ms in zip(result.samples, cpu, strict=True)])
        # One short transaction per invocation: a kill loses at most the one running now,
        # and no transaction stays open while the next process runs.
        session.commit()
        progress.invocation(name, next(done), planned[0])

    return store
