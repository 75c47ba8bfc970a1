"""Samples a process, chosen from the variance components (Kalibera & Jones, "Rigorous
benchmarking in reasonable time", ISMM 2013).

A measured process costs a fixed part (its start, or its fork, the library's load, its inputs,
its warm-up, its reply) and then ``samples`` timed samples; the statistics take each
process's fastest sample, and an interval's width at a given time falls with the spread of
those figures between processes. More samples a process make its fastest sample steadier
but each process dearer; fewer make processes cheap but their figures spread more. The time
to an interval of a given width is proportional to ``cv(n)^2 * seconds(n)``: the processes
it needs (the variance of their figures) times what each costs. :func:`choose_samples`
measures ``cv(n)`` on processes that took more samples than ``n``, each one's first ``n``
samples being what a process of ``n`` samples would have taken, and picks the cheapest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CANDIDATES = (5, 10, 20, 50, 100, 200, 500)
MIN_PROCESSES = 6  # fewer processes than this give no usable spread
MIN_GAIN = 0.2  # the configured count is kept unless another is at least this much cheaper


@dataclass(frozen=True)
class SamplesOption:
    """One candidate count of samples a process, and what it would cost."""

    samples: int
    process_cv: float  # the spread of processes' fastest of their first ``samples`` samples
    seconds: float  # one process: its fixed part plus ``samples`` samples
    relative_time: float  # time to a given interval width, against the configured count's (1.0)


@dataclass(frozen=True)
class SamplesChoice:
    """The samples a process that reach an interval's width fastest, and why."""

    samples: int
    configured: int
    options: tuple[SamplesOption, ...]
    reason: str


def _cv(values: Sequence[float]) -> float:
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else math.inf


def choose_samples(processes: Sequence[Sequence[float]], fixed_s: float, sample_s: float, configured: int,
                   candidates: Sequence[int] = CANDIDATES, min_gain: float = MIN_GAIN) -> SamplesChoice:
    """The samples a process to take from now on, from earlier processes' samples.

    ``processes``: each process's samples in the order it took them (any unit), all taken
    with ``configured`` samples a process or more; ``fixed_s``: a process's cost besides its
    samples and ``sample_s`` one sample's, in seconds (their medians over those processes).
    Candidates above the fewest samples any process took cannot be measured and are left
    out. The configured count stays unless another is at least ``min_gain`` cheaper: the
    spread of a few processes is itself uncertain, and a changed count moves a process's
    fastest sample (so the series' level) a little.
    """
    if len(processes) < MIN_PROCESSES:
        raise ValueError(f"choose_samples needs at least {MIN_PROCESSES} processes, got {len(processes)}")
    if fixed_s < 0 or sample_s <= 0:
        raise ValueError("fixed_s must be >= 0 and sample_s > 0")
    most = min(len(p) for p in processes)
    counts = sorted({n for n in (*candidates, configured) if n <= most})
    if configured not in counts:
        raise ValueError(f"every process needs the configured {configured} samples, the fewest took {most}")
    options = []
    for n in counts:
        cv = _cv([min(p[:n]) for p in processes])
        options.append((n, cv, fixed_s + n * sample_s))
    base_cv, base_s = next((cv, seconds) for n, cv, seconds in options if n == configured)

    def relative(cv: float, seconds: float) -> float:
        if base_cv > 0:
            return cv * cv * seconds / (base_cv * base_cv * base_s)
        return seconds / base_s if cv == 0 else math.inf  # no spread at all: the cost alone

    table = tuple(SamplesOption(n, cv, seconds, relative(cv, seconds)) for n, cv, seconds in options)
    best = min(table, key=lambda o: (o.relative_time, -o.samples))
    keep = best.relative_time > 1.0 - min_gain
    chosen = configured if keep else best.samples
    figures = ", ".join(f"{o.samples}: cv {o.process_cv:.2%} x {o.seconds * 1000:.0f} ms" for o in table)
    why = (f"configured; no count reaches the same width in {1 - min_gain:.0%} of the time" if keep
           else f"{1 - best.relative_time:.0%} less time to the same width than {configured}")
    reason = f"{chosen} samples a process ({why}; {len(processes)} processes: {figures})"
    return SamplesChoice(samples=chosen, configured=configured, options=table, reason=reason)
