"""Simulated trials: noise shapes seen on real machines, with a known injected change."""

from __future__ import annotations

import random

import numpy as np

from benchmarks.detector.rules import Trial
from abwatch.core.sides import CONTROL
from abwatch.runners.harness import interleaved_schedule

SHAPES = ("lognormal", "bimodal", "drift", "heavy-tail", "phases")


def _machine(rng: np.random.Generator, shape: str, slots: int) -> np.ndarray:
    """The machine's speed factor at each process slot, in run order."""
    speed = np.ones(slots)
    if shape == "drift":  # slowly warming up or throttling: +6 % across the run
        speed *= np.linspace(1.0, 1.06, slots)
    if shape == "phases":  # contention that comes and goes, lasting several processes
        slow, factor = False, 1.0
        for i in range(slots):
            if rng.random() < (0.3 if slow else 0.1):
                slow = not slow
                factor = rng.uniform(1.02, 1.08) if slow else 1.0
            speed[i] = factor
    return speed


def _process(rng: np.random.Generator, shape: str, median: float, m: int) -> list[float]:
    values = median * rng.lognormal(rng.normal(0, 0.005), 0.01, m)
    if shape == "bimodal":  # pre-emption: ~8 % of samples about 2.3x slower
        values[rng.random(m) < 0.08] *= 2.3
    if shape == "heavy-tail":
        outliers = rng.random(m) < 0.05
        values[outliers] *= 1 + rng.pareto(1.5, outliers.sum())
    return list(values)


def trial(rng: np.random.Generator, shape: str, change: float, pairs: int, m: int = 5,
          layout: str = "interleaved") -> Trial:
    """One trial of ``pairs`` processes a side; ``layout`` 'interleaved' or 'blocks'."""
    if layout == "interleaved":
        order = [s.side for s in interleaved_schedule(pairs, 0, random.Random(int(rng.integers(2**31))))]
    else:  # FAI-PEP's layout: all of one side, then all of the other
        order = [CONTROL] * pairs + ["treatment"] * pairs
    speed = _machine(rng, shape, len(order))
    control, treatment = [], []
    for side, factor in zip(order, speed, strict=False):
        median = 10.0 * factor * (1.0 if side == CONTROL else 1.0 + change)
        (control if side == CONTROL else treatment).append(_process(rng, shape, median, m))
    return Trial(control, treatment)
