"""The stopping rule's look at a timed workload, with how contended its processes were.

Each look assesses the contention of every measured process so far
(:func:`service.stats.contention.assess`). Below heavy contention the look judges the wall-time
samples, as it always did; under heavy contention it judges each process's CPU time instead
(one value per process, paired by the interleaved order), and where the processes have no
CPU time (a kind that does not measure it) the verdict is refused as ``unknown`` with the
reason once the rule stops. See docs/statistics.md ("Sizes under heavy contention"). A duet on
one CPU (``run.schedule = "duet-one-cpu"``) is judged so at any load: each side shares its CPU
with the other. Where
processes were forked from fork servers, each look passes their servers along, so the pairs
are judged with the server as a level (:mod:`service.stats.levels`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.harness import Measurement
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.builders.workload_spec import WorkloadSpec
from abwatch.service import stats
from abwatch.service.config import Config

SIDES = (CONTROL, TREATMENT)


def _by_process(m: Measurement) -> dict[tuple[str, int], list[float]]:
    """The wall-time samples of ``m`` by process: (side, position) -> its samples."""
    taken: dict[tuple[str, int], list[float]] = {}
    for side in SIDES:
        for ms, group in zip(m.samples[side], m.groups[side], strict=True):
            taken.setdefault((side, group), []).append(ms)
    return taken


def assessed(m: Measurement, config: Config) -> stats.Contention:
    """The contention of the measured processes of both sides of ``m``, with each process's
    fastest sample and number of samples (how likely its fastest was a clean one)."""
    figures = [f for side in SIDES for f in m.processes[side]]
    taken = _by_process(m)
    own = [taken.get((side, f.position), []) for side in SIDES for f in m.processes[side]]
    # a process on n threads can use n seconds of CPU a second: its share is per thread
    return stats.assess([f.wall_s * f.threads for f in figures], [f.cpu_s for f in figures],
                        [f.involuntary_switches for f in figures], max_share=config.stats.contention_share,
                        fastest_s=[min(ms) / 1000.0 if ms else None for ms in own], samples=[len(ms) for ms in own])


def has_cpu_samples(m: Measurement) -> bool:
    """Whether every measured process of ``m`` marked each of its samples' CPU time."""
    taken = _by_process(m)
    return all((side, f.position) in taken and len(f.cpu_samples) == len(taken[side, f.position])
               for side in SIDES for f in m.processes[side])


def on_cpu(m: Measurement, per_sample: bool) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """The CPU time of each process of ``m``, one value a process, and their processes: the
    mean of the faster half of its samples' own where every process marked them
    (``per_sample``: :func:`has_cpu_samples`; its timed calls alone; :func:`stats.cpu_figure`
    says why that half), else its timing batch's."""
    if per_sample:
        return ({side: [stats.cpu_figure(f.cpu_samples) for f in m.processes[side]] for side in SIDES},
                {side: [f.position for f in m.processes[side]] for side in SIDES})
    return ({side: [1000.0 * (f.cpu_s or 0.0) for f in m.processes[side]] for side in SIDES},
            {side: [f.position for f in m.processes[side]] for side in SIDES})


def judged_samples(m: Measurement, verdict: stats.Verdict) -> tuple[dict[str, list[float]], dict[str, list[int]],
                                                                    Callable[[Sequence[float]], float]]:
    """What ``verdict`` judged: the samples, their processes, and what a process was judged by
    of its samples, for what the run teaches the noise history (service.compare.noise.learn):
    each sample's CPU time and :func:`stats.cpu_figure` where it was judged on them, else the wall-time
    samples and their fastest."""
    if verdict.unit == stats.CPU_UNIT and has_cpu_samples(m):
        return ({side: [ms for f in m.processes[side] for ms in f.cpu_samples] for side in SIDES},
                {side: [f.position for f in m.processes[side] for _ in f.cpu_samples] for side in SIDES},
                stats.cpu_figure)
    return m.samples, m.groups, min


def server_labels(m: Measurement, groups: Mapping[Any, Sequence[int]]) -> dict[str, Any]:
    """``control_servers`` and ``treatment_servers`` for :func:`stats.compare` of values from the
    timed processes of ``m``, each labelled by ``groups`` with its process's position: each
    process's fork server, so that pairs sharing servers are judged with the server as a level
    (:mod:`service.stats.levels`); none where no process was forked."""
    server = {side: {f.position: f.server for f in m.processes[side]} for side in SIDES}
    if all(s is None for side in SIDES for s in server[side].values()):
        return {}
    return {f"{side}_servers": [server[side].get(g) for g in groups[side]] for side in SIDES}


def threads_note(config: Config, workload: WorkloadSpec, duet: bool = False) -> str:
    """What a TVM workload's threads a process mean for its verdict on a busy host, for the
    report: one (the default on this host's CPU) keeps a verdict under heavy contention judged
    on CPU time; more are refused there, which the note says where a workload asks for them.
    Empty for other kinds, other runners and duets (whose sides take their pinned cores)."""
    if not WORKLOAD_KINDS[workload.kind].threaded or config.runner.kind != "cpu" or duet:
        return ""
    own = getattr(workload, "threads", None)  # a threaded kind's config has its own ``threads``
    asked = own if own is not None else config.runner.threads
    threads = config.runner.measured_threads(own, host_cpu=True)
    if threads == 1:
        return "1 thread a process" + (" (the default: a verdict that stands on a busy host)" if asked is None else "")
    return (f"{threads} threads a process ({'asked for' if asked is not None else 'the default'}): under heavy "
            "contention a verdict on several threads is refused (their CPU time waiting inflates too); "
            "threads = 1 decides on a busy host")


# why a duet on one CPU is judged on CPU time, whatever the load (runners/duet.py)
ONE_CPU = "a duet on one CPU (each side waits out the other's time slices)"


def look(m: Measurement, config: Config, *, look: int, elapsed_s: float, budget: stats.Budget, seed: int,
         plan_pairs: int, one_cpu: bool = False) -> stats.Look:
    """One look of :func:`service.stats.sequential_look` at ``m``: on wall time, or under heavy
    contention on CPU time per process (or refused where there is none); ``one_cpu``: its pairs
    ran as duets on one CPU, judged on CPU time at any load."""
    options: dict[str, Any] = dict(
                   look=look, elapsed_s=elapsed_s, budget=budget, threshold_pct=config.stats.threshold_pct,
                   alpha=config.stats.alpha, confidence=config.stats.confidence,
                   resamples=config.stats.bootstrap_resamples, seed=seed,
                   equivalence_alpha=config.stats.equivalence_alpha, plan_pairs=plan_pairs)
    contention = assessed(m, config)
    processes = [f for side in SIDES for f in m.processes[side]]
    # CPU time stands in for wall time only for one thread: the threads of a pool that wait for
    # a preempted sibling spin, and waiting would inflate CPU time as much as wall time
    shared = one_cpu or contention.heavy  # whatever waits for a CPU: the other side, or the load
    because = ONE_CPU if one_cpu else None
    if shared and all(f.cpu_s is not None and f.threads == 1 for f in processes):
        per_sample = has_cpu_samples(m)
        cpu, groups = on_cpu(m, per_sample)
        step = stats.sequential_look(cpu[CONTROL], cpu[TREATMENT], groups[CONTROL], groups[TREATMENT], **options,
                                     **server_labels(m, groups))
        # n and the plain medians stay the timing samples' (the report's n, the history's series),
        # whatever the verdict was judged by
        verdict = replace(stats.on_cpu_time(step.verdict, contention, per_sample, because),
                          control_n=len(m.samples[CONTROL]), treatment_n=len(m.samples[TREATMENT]),
                          control_median_ms=statistics.median(m.samples[CONTROL]),
                          treatment_median_ms=statistics.median(m.samples[TREATMENT]))
        return replace(step, verdict=verdict)
    step = stats.sequential_look(m.samples[CONTROL], m.samples[TREATMENT], m.groups[CONTROL], m.groups[TREATMENT],
                                 **options, **server_labels(m, m.groups))
    if shared and step.stop:
        why = ("processes ran on several threads, whose CPU time waiting inflates too"
               if all(f.cpu_s is not None for f in processes) else "processes have no CPU time to judge on")
        return replace(step, verdict=stats.refused(step.verdict, contention, why, because))
    return step
