"""Fresh processes of both sides, interleaved, until the stopping rule stops.

The loop that compile time (:mod:`service.compare.compile_time`) and instruction counts
(:mod:`service.compare.instructions`) share: the first look's ABBA/BAAB pairs, then the
stopping rule (:func:`stats.sequential_look`) after each look, and the pairs it asks for next,
up to ``most`` pairs and ``max_seconds``. What differs between them is passed in: what one
invocation does, how invocations are mapped (one at a time, or a pool), the threshold and
the fewest pairs that may decide.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.results import InvocationResult
from abwatch.runners.harness import Slot, interleaved_schedule
from abwatch.service import stats

BATCH = 2  # pairs added after a look that decided nothing


@dataclass(frozen=True)
class Judged:
    """What the loop ended with: the verdict of its last look (None when an invocation failed,
    then ``failure`` says which and why), every sample, and the seconds it took."""

    verdict: stats.Verdict | None
    samples: dict[str, list[float]]
    failure: str | None
    elapsed_s: float
    # every invocation of each side with its interleaved position: what else it measured
    # (its peak memory) is judged from these by the metric registry
    results: dict[str, list[tuple[int, InvocationResult]]] | None = None


@dataclass(frozen=True)
class Rule:
    """How the pairs are judged: the stopping rule's settings (``config.stats``) with the
    metric's threshold, and the fewest pairs (``first``) that may decide."""

    threshold_pct: float
    alpha: float
    confidence: float
    equivalence_alpha: float
    first: int
    most: int
    max_seconds: float
    seed: int


def until_decided(invoke: Callable[[Slot], InvocationResult], rule: Rule, rng: random.Random, what: str,
                  each: Callable[[Callable[[Slot], InvocationResult], Iterable[Slot]], Iterator[InvocationResult]]
                  = map) -> Judged:
    """Invoke fresh processes of both sides in interleaved pairs (``each`` maps ``invoke`` over
    a look's slots: the built-in ``map``, or a pool's) and judge them after each look. The first
    failed invocation ends it, named as ``"<side> <what> <position> <status>: <message>"``."""
    budget = stats.Budget(max_seconds=rule.max_seconds, max_pairs=rule.most, batch=BATCH)
    samples: dict[str, list[float]] = {CONTROL: [], TREATMENT: []}
    groups: dict[str, list[int]] = {CONTROL: [], TREATMENT: []}
    results: dict[str, list[tuple[int, InvocationResult]]] = {CONTROL: [], TREATMENT: []}
    started, look = time.monotonic(), 0
    schedule = interleaved_schedule(min(rule.most, rule.first), 0, rng)
    while True:
        for slot, result in zip(schedule, each(invoke, schedule), strict=True):
            if result.status != "ok":
                failure = f"{slot.side} {what} {slot.position} {result.status}: {result.message}"
                return Judged(None, samples, failure, time.monotonic() - started, results)
            samples[slot.side].extend(result.samples)
            results[slot.side].append((slot.position, result))
            groups[slot.side].extend([slot.position] * len(result.samples))
        look += 1
        step = stats.sequential_look(
            samples[CONTROL], samples[TREATMENT], groups[CONTROL], groups[TREATMENT], look=look,
            elapsed_s=time.monotonic() - started, budget=budget, threshold_pct=rule.threshold_pct,
            alpha=rule.alpha, confidence=rule.confidence, equivalence_alpha=rule.equivalence_alpha,
            seed=rule.seed, min_pairs=rule.first,
            # one sample a process: the first look's samples may decide (the default asks 5)
            min_samples=min(rule.first, stats.MIN_SAMPLES))
        if step.stop:
            return Judged(step.verdict, samples, None, time.monotonic() - started, results)
        schedule = interleaved_schedule(step.next_pairs, 0, rng, start=schedule[-1].position + 1)


def rule(config, threshold_pct: float, first: int, most: int, seed: int) -> Rule:
    """The :class:`Rule` of ``config`` (its ``stats`` and ``run.max_seconds``) at a metric's
    threshold, first look and most pairs."""
    s = config.stats
    return Rule(threshold_pct, s.alpha, s.confidence, s.equivalence_alpha, first, most, config.run.max_seconds, seed)
