"""Instruction counts judged like wall time, for workloads with ``measure = [..., "instructions"]``.

A counted invocation is one fresh process of the workload run under an instruction counter
(:mod:`abwatch.runners.counters`: the hardware counter through perf where the kernel offers
it, Valgrind otherwise); its one sample is the instructions it retired. Control and treatment
processes run in interleaved ABBA/BAAB pairs, and the same stopping rule as wall time
(:func:`stats.sequential_look`) judges their paired log ratios after each batch, with the
threshold ``stats.instructions_threshold_pct`` (default 0.5 %), up to
``run.instruction_repetitions`` pairs. Counts that vary between processes (a build that
randomizes, threads) widen the interval like noisy times do: the verdict is then an honest
``unknown``, never a guess.

The verdict is kept in the comparison's details under ``instructions`` (with the counter's
name as ``source`` and every count); when ``instructions`` is a workload's first metric it is
also the comparison's verdict. A regression on instructions opens (or is noted on) the
workload's ``runtime`` regression with ``metric = instructions``, and is verified and
bisected on instructions.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.runner import Runner
from abwatch.runners.results import InvocationResult
from abwatch.runners.counters import CounterUnavailable, choose
from abwatch.runners import profiles
from abwatch.runners.harness import Slot
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.service import stats
from abwatch.service.compare import fresh
from abwatch.service.stats.verdict import Metric

# A near-deterministic metric needs few processes: the counts of a TVM compile region differ
# by ~0.01 % between processes, so 3 pairs bound the change far inside 0.5 % (the C ground
# truth: 100 % right at 3 pairs, docs/statistics.md); counts that vary more widen the
# interval (Student's t at 2 degrees of freedom) and more pairs are added, as for time.
FIRST_LOOK = 3
UNIT = "instructions"
# what is counted: the workload's run (a command's whole process, a TVM workload's timed
# calls) or, for kinds that compile, the compile call; and where its verdict is kept
WHAT = {"run": Metric.INSTRUCTIONS.value, "compile": "compile_instructions"}


@dataclass(frozen=True)
class CountJudged:
    """The instructions verdict of one workload, the counts behind it and who counted them."""

    verdict: stats.Verdict
    samples: dict[str, list[float]]
    source: str  # the counter's name: perf or valgrind
    failure: str | None = None
    # the functions the counts were spent in: each side's median-count process (stored shape of
    # runners.profiles.Profile), None where the counter counts no functions
    profiles: dict[str, dict] | None = None


def wanted(workload) -> bool:
    """Whether ``workload`` is measured on instructions."""
    return Metric.INSTRUCTIONS.value in workload.measure


def counts_compiles(workload, config) -> bool:
    """Whether ``workload``'s compile is counted: instructions are measured, its kind compiles,
    and compiles are measured at all (``run.compile_repetitions`` > 0)."""
    return wanted(workload) and WORKLOAD_KINDS[workload.kind].times_compiles and config.run.compile_repetitions > 0


def primary(workload) -> Metric:
    """The metric whose verdict is the comparison's (the first in ``measure``)."""
    return Metric(workload.measure[0])


def unmeasured(reason: str) -> stats.Verdict:
    """An ``unknown`` instructions verdict that was never judged, saying why."""
    return replace(stats.compare([], []), reason=f"not judged: {reason}", unit=UNIT)


def measure(runner: Runner, workload, artifacts: Mapping[Any, Path], config, seed: int,
            rng: random.Random, progress, timeout_s: float, what: str = "run") -> CountJudged | None:
    """Counted fresh processes of both sides, interleaved, until the stopping rule stops;
    None when the workload is not measured on instructions (or, for ``what="compile"``, its
    compile is not counted). ``run.counted_jobs`` processes run at once: a count does not
    depend on what else the machine does."""
    if not (counts_compiles(workload, config) if what == "compile" else wanted(workload)):
        return None
    try:
        counter = choose(config.run.counter)
    except CounterUnavailable as exc:
        return CountJudged(unmeasured(str(exc)), {CONTROL: [], TREATMENT: []}, config.run.counter, str(exc))
    most = config.run.instruction_repetitions
    label = "compile instructions" if what == "compile" else "instructions"
    progress.message(f"  {workload.name}: {label} ({counter.name}): {min(most, FIRST_LOOK)} pairs of counted "
                     f"processes to start, {config.run.counted_jobs} at a time")

    counted: list[tuple[str, InvocationResult]] = []  # appended from the pool's threads (atomic)
    failed: list[int] = []  # positions of failed counted processes (appended from the pool's threads)

    def count(slot: Slot) -> InvocationResult:
        # The first failed process ends the counting (fresh.until_decided), and the rest of its
        # look would fail alike (code the counter cannot run, SIGILL, fails in every process):
        # a slot after a failed one is not run. Only after it: the loop reports the first
        # failure in the look's order, which must be a real one.
        if any(position < slot.position for position in failed):
            return InvocationResult("error", (), 0.0, "not started: an earlier counted process failed")
        result = runner.count_instructions(artifacts[slot.side], workload, timeout_s, counter, slot.side, what)
        if result.status != "ok":
            failed.append(slot.position)
        counted.append((slot.side, result))
        return result

    rule = fresh.rule(config, config.stats.instructions_threshold_pct, FIRST_LOOK, most, seed)
    with ThreadPoolExecutor(max_workers=config.run.counted_jobs) as pool:
        judged = fresh.until_decided(count, rule, rng, "counted process", each=pool.map)
    kept = median_profiles(counted)
    if judged.verdict is None:
        verdict = replace(unmeasured(judged.failure or ""), stop_reason="counted process failed",
                          elapsed_s=judged.elapsed_s)
        return CountJudged(verdict, judged.samples, counter.name, judged.failure)
    estimator = ("instructions of the compile call per process" if what == "compile" else
                 "instructions per call of the timed calls" if WORKLOAD_KINDS[workload.kind].times_compiles
                 else "instructions per process")
    return CountJudged(replace(judged.verdict, unit=UNIT, estimator=f"{estimator}, median across processes"),
                       judged.samples, counter.name, profiles=kept)


def median_profiles(counted: list[tuple[str, InvocationResult]]) -> dict[str, dict] | None:
    """Each side's profile of its median-count process (the lower median for an even number),
    None unless both sides have one. The median process, not the first: the verdict is on the
    sides' medians, and a process that ran apart from its side (a first one warming a cache)
    would explain a difference the verdict did not see."""
    chosen: dict[str, dict] = {}
    for side in (CONTROL, TREATMENT):
        ok = sorted((r for s, r in counted if s == side and r.status == "ok" and r.samples),
                    key=lambda r: r.samples[0])
        median = ok[(len(ok) - 1) // 2].profile if ok else None
        if median is None:
            return None
        chosen[side] = median
    return chosen


def details(judged: CountJudged) -> dict:
    """The ``instructions`` object of a comparison's details (and of ``--json``): the whole
    verdict (:meth:`Verdict.to_dict`, ``unit`` "instructions"), the counter as ``source``, the
    processes' count per side as ``n``, the failure if any, every count, and the ``profile``
    (:func:`profile_details`)."""
    return {
        **judged.verdict.to_dict(), "source": judged.source,
        "n": [len(judged.samples[CONTROL]), len(judged.samples[TREATMENT])], "failure": judged.failure,
        "control_counts": [int(c) for c in judged.samples[CONTROL]],
        "treatment_counts": [int(c) for c in judged.samples[TREATMENT]],
        "profile": profile_details(judged),
    }


def profile_details(judged: CountJudged) -> dict:
    """Where the counts were spent: each side's median-count process's top functions
    (``control``, ``treatment``: :meth:`Profile.to_dict`) and the functions that grew most
    (``grew``: :func:`profiles.grew`; ``no_symbol``: what code without a symbol ran,
    :func:`profiles.unnamed`), or the ``reason`` there is none."""
    if judged.profiles is None:
        reason = ("perf counts instructions, not the functions they ran in" if judged.source == "perf"
                  else "no per-function counts were read" if not judged.failure else "the counting failed")
        return {"reason": reason}
    control, treatment = (profiles.Profile.from_dict(judged.profiles[side]) for side in (CONTROL, TREATMENT))
    return {"process": "median count of each side", "control": control.to_dict(), "treatment": treatment.to_dict(),
            "grew": profiles.grew(control, treatment), "no_symbol": profiles.unnamed(control, treatment)}


def verdict_of(workload_details: Mapping[str, Any] | None, what: str = "run") -> stats.Verdict:
    """The instructions verdict (of the run, or of the compile) a comparison's details hold
    (``unknown`` when none was made): what verify and bisection judge a regression opened
    on instructions by."""
    found = (workload_details or {}).get(WHAT[what]) or {}
    if not found.get("verdict") or found.get("failure"):
        return unmeasured(found.get("failure") or "instructions not counted")
    return stats.Verdict.from_dict(found)


def judged(result) -> tuple[stats.Verdict, str | None]:
    """A workload result's instructions verdict, and why it was not judged (None when it was):
    what bisection reads of each step for a regression opened on instructions."""
    if result.failure:
        return result.verdict, result.failure
    found = result.instructions or {}
    if not found.get("verdict"):
        return unmeasured("instructions not counted"), "instructions not counted"
    return verdict_of({Metric.INSTRUCTIONS.value: found}), found.get("failure")


def adjust(judged_list: list[CountJudged | None]) -> list[CountJudged | None]:
    """Benjamini-Hochberg across one run's instructions verdicts (a family of its own)."""
    present = [j for j in judged_list if j is not None]
    adjusted = iter(stats.adjust_fdr([j.verdict for j in present]))
    return [None if j is None else replace(j, verdict=next(adjusted)) for j in judged_list]


def judged_compile(result) -> tuple[stats.Verdict, str | None]:
    """A workload result's compile-instructions verdict, and why it was not judged (None when
    it was): what bisection reads of each step for a ``compile-time`` regression opened on
    instructions."""
    if result.failure:
        return result.verdict, result.failure
    found = result.compile_instructions or {}
    if not found.get("verdict"):
        return unmeasured("compile instructions not counted"), "compile instructions not counted"
    return verdict_of({WHAT["compile"]: found}, "compile"), found.get("failure")
