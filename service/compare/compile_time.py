"""Compile time judged like run time, for ``tvm`` workloads.

It is the compiler's speed that is measured, so every compile is a fresh process (a warm
process would time TVM's caches, not the compiler): a worker of the side's build compiles
the workload once and exits. Control and treatment compiles run in interleaved ABBA/BAAB
pairs, and the same stopping rule as run time (:func:`stats.sequential_look`) judges their
paired log ratios after each batch, up to ``run.compile_repetitions`` pairs and within what
is left of ``run.max_seconds``. The verdict is kept in the comparison's details under
``compile`` (nothing is written to the samples table, which holds run times); a slower
compile opens a ``compile-time`` regression that goes through the usual lifecycle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from sqlalchemy.orm import Session

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.runner import Runner
from abwatch.runners.results import InvocationResult
from abwatch.runners.harness import Slot
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.service import stats
from abwatch.service.compare import fresh, lifecycle
from abwatch.service.stats.verdict import Metric, RegressionKind
from abwatch.service.store.models import Comparison, Regression, Run
from abwatch.service.compare.outcome import verdict_json

KIND = RegressionKind.COMPILE_TIME
FIRST_LOOK = stats.MIN_PAIRS  # fewer pairs cannot decide anything


@dataclass(frozen=True)
class CompileJudged:
    """The compile-time verdict of one workload and the compile times (ms) behind it."""

    verdict: stats.Verdict
    samples: dict[str, list[float]]
    failure: str | None = None
    # each side's compile processes with their interleaved positions (their peak memory too)
    results: dict[str, list[tuple[int, InvocationResult]]] | None = None


def measure(runner: Runner, workload, artifacts: Mapping[Any, Path], config, seed: int,
            rng: random.Random, progress, timeout_s: float) -> CompileJudged | None:
    """Fresh-process compiles of both sides, interleaved, until the stopping rule stops;
    None when compile time is not judged (not a TVM workload, or ``compile_repetitions`` 0)."""
    most = config.run.compile_repetitions
    if not WORKLOAD_KINDS[workload.kind].times_compiles or most < 1:
        return None
    progress.message(f"  {workload.name}: compile time: {min(most, FIRST_LOOK)} pairs of fresh-process compiles "
                     "to start")

    def compile_once(slot: Slot) -> InvocationResult:
        return runner.compile_time(artifacts[slot.side], workload, timeout_s, slot.side)

    rule = fresh.rule(config, config.stats.threshold_pct, FIRST_LOOK, most, seed)
    judged = fresh.until_decided(compile_once, rule, rng, "compile")
    if judged.verdict is None:
        verdict = replace(stats.compare([], []), reason=f"not judged: {judged.failure}",
                          stop_reason="compile failed", elapsed_s=judged.elapsed_s)
        return CompileJudged(verdict, judged.samples, judged.failure, judged.results)
    return CompileJudged(judged.verdict, judged.samples, results=judged.results)


def details(judged: CompileJudged) -> dict:
    """The ``compile`` object of a TVM comparison's details (and of ``--json``): the whole
    verdict (:meth:`Verdict.to_dict`), the compiles' count per side as ``n``, the failure if
    any, and every compile time."""
    return {
        **judged.verdict.to_dict(),
        "n": [len(judged.samples[CONTROL]), len(judged.samples[TREATMENT])], "failure": judged.failure,
        "control_ms": judged.samples[CONTROL], "treatment_ms": judged.samples[TREATMENT],
    }


def open_slower(session: Session, run: Run, comparison: Comparison, metric: Metric, verdict: stats.Verdict,
                reason: str | None, attach=None) -> int:
    """Open the ``compile-time`` regression a benchmark run's slower compiles call for (found by
    :func:`service.compare.decide.decide`: ``metric``'s ``verdict``), or note it on the open one
    ``attach`` finds it the same as. The regression's id."""
    regression: Regression = lifecycle.open_or_attach(
        session, run, comparison, KIND, verdict, attach, reason=reason, metric=metric)
    if regression.run_id != run.id:  # a re-run of the pair, or attached: the one opened earlier stays as it was
        return regression.id
    assert verdict.change_pct is not None  # a regression verdict always carries its estimate
    regression.change_pct = verdict.change_pct
    regression.benchmark_verdict = {**verdict_json(verdict, run.id), "kind": KIND.value, "metric": metric.value}
    session.flush()
    return regression.id


def verdict_of(workload_details: Mapping[str, Any] | None) -> stats.Verdict:
    """The compile-time verdict a comparison's details hold (``unknown`` when none was made),
    as a :class:`stats.Verdict`, for verify to confirm or clear a ``compile-time`` regression."""
    c = (workload_details or {}).get("compile") or {}
    if not c.get("verdict") or c.get("failure"):
        return replace(stats.compare([], []), reason=f"compile time not judged: {c.get('failure') or 'no compiles'}")
    if "control_n" in c:  # kept whole (details)
        return stats.Verdict.from_dict(c)
    # written before the whole verdict was kept: its threshold and levels were not stored
    return stats.Verdict(
        stats.Outcome(c["verdict"]), c["change_pct"], tuple(c["ci_pct"]) if c["ci_pct"] else None, c["p_value"],
        c["n"][0], c["n"][1], c["control_median_ms"], c["treatment_median_ms"], 0.0, 0.0, 0.0, c["reason"],
        c.get("p_adjusted"), c.get("correction", "none"), c.get("stop_reason", ""), c.get("method", ""),
        c.get("looks", 0), c.get("elapsed_s"))


def judged(result) -> tuple[stats.Verdict, str | None]:
    """A workload result's compile-time verdict, and why it was not judged (None when it was):
    what bisection reads of each step for a ``compile-time`` regression (``result`` is a
    :class:`service.compare.outcome.WorkloadResult`)."""
    if result.failure:  # the run itself failed: nothing was compiled for timing
        return result.verdict, result.failure
    found = (result.details or {}).get("compile") or {}
    if not found.get("verdict"):
        return verdict_of(result.details), "compile time not measured"
    return verdict_of(result.details), found.get("failure")


def adjust(judged: list[CompileJudged | None]) -> list[CompileJudged | None]:
    """Benjamini-Hochberg across one run's compile-time verdicts (a family of its own)."""
    present = [j for j in judged if j is not None]
    adjusted = iter(stats.adjust_fdr([j.verdict for j in present]))
    return [None if j is None else replace(j, verdict=next(adjusted)) for j in judged]
