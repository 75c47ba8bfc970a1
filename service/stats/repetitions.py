"""Samples a process and children a fork server, chosen from the variance components
(Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013).

A measured process costs a fixed part (its start, or its fork, the library's load, its inputs,
its warm-up, its reply) and then ``samples`` timed samples; the statistics take each
process's fastest sample, and an interval's width at a given time falls with the spread of
those figures between processes. More samples a process make its fastest sample steadier
but each process dearer; fewer make processes cheap but their figures spread more. The time
to an interval of a given width is proportional to ``cv(n)^2 * seconds(n)``: the processes
it needs (the variance of their figures) times what each costs. :func:`choose_samples`
measures ``cv(n)`` on processes that took more samples than ``n``, each one's first ``n``
samples being what a process of ``n`` samples would have taken, and picks the cheapest.

One level up, forked processes (``[runner] processes = "forked"``) share their fork server's
memory layout: :func:`choose_children` weighs a server's start (an ``import tvm``) against the
variance its layout adds and the fewer independent units (server pairs) that more children a
server leave the interval (:mod:`service.stats.levels`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from abwatch.service.stats.core import DEFAULT_ALPHA, MIN_PAIRS, cs_multiplier
from abwatch.service.stats.levels import MIN_BLOCKS, intraclass, shared_blocks

# From 5: 2 samples a process were tried (builtin:mlp at batch 128 beside six busy loops, judged
# on the mean of its samples' CPU times) and made A/A intervals of ±2.3-3.4 % at 67-70 pairs in
# 120 s, where 5 had made ±1.3-2.0 % at 57-85 (docs/statistics.md).
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


def _per_side(figures: list[float], sides: Sequence[str] | None) -> list[float]:
    """``figures`` each relative to its side's median (as they are where ``sides`` is None): a
    real difference between the sides is no process's noise, and would add the same spread to
    every count's (so the cheapest count would look best)."""
    if sides is None:
        return figures
    if len(sides) != len(figures):
        raise ValueError(f"choose_samples: {len(sides)} sides for {len(figures)} processes")
    middle = {side: statistics.median(f for f, s in zip(figures, sides, strict=True) if s == side)
              for side in set(sides)}
    return [f / middle[s] if middle[s] > 0 else f for f, s in zip(figures, sides, strict=True)]


def choose_samples(processes: Sequence[Sequence[float]], fixed_s: float, sample_s: float, configured: int,
                   candidates: Sequence[int] = CANDIDATES, min_gain: float = MIN_GAIN,
                   typical: Callable[[Sequence[float]], float] = min,
                   sides: Sequence[str] | None = None) -> SamplesChoice:
    """The samples a process to take from now on, from earlier processes' samples.

    ``processes``: each process's samples in the order it took them (any unit), all taken
    with ``configured`` samples a process or more; ``fixed_s``: a process's cost besides its
    samples and ``sample_s`` one sample's, in seconds (their medians over those processes).
    Candidates above the fewest samples any process took cannot be measured and are left
    out. The configured count stays unless another is at least ``min_gain`` cheaper: the
    spread of a few processes is itself uncertain, and a changed count moves a process's
    fastest sample (so the series' level) a little. ``typical``: what a process is judged
    by, of its first ``n`` samples (its fastest; the mean where it is judged on CPU time).
    ``sides``: each process's side, where the processes are of a comparison whose sides may
    differ (a run that found a change still teaches its counts): each side's figures are then
    taken relative to their own median.
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
        cv = _cv(_per_side([typical(p[:n]) for p in processes], sides))
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


CHILDREN_CANDIDATES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
MIN_SERVERS = 4  # servers of two children or more: fewer give no usable between-server variance
HORIZON = 10  # a count's pairs to the width are sought up to this many times the run's


@dataclass(frozen=True)
class ChildrenOption:
    """One candidate count of children a fork server, and what it would cost."""

    children: int
    server_pairs: int  # the independent units at the pairs it needs (the interval's widening counts them)
    relative_time: float  # time to a given interval width, against the best option's (1.0); inf: no interval


@dataclass(frozen=True)
class ChildrenChoice:
    """The children a fork server that reach an interval's width fastest, and why."""

    children: int
    configured: int
    rho: float  # the share of the processes' variance between servers the choice weighed (pooled)
    options: tuple[ChildrenOption, ...]
    reason: str
    run_rho: float  # this run's own estimate of it (what a history folds in)


def servers_share(figures: Sequence[float], servers: Sequence[Hashable], sides: Sequence[str]) -> tuple[float, int]:
    """The share of forked processes' variance between their servers (rho) and how many servers
    there were: ``figures`` each process's (positive), ``servers`` its server (a label unique
    across sides), ``sides`` its side, whose own level is taken out first (a real difference
    between the sides is not a server's); at least :data:`MIN_SERVERS` of two children."""
    if not len(figures) == len(servers) == len(sides):
        raise ValueError(f"choose_children: {len(figures)} figures, {len(servers)} servers, {len(sides)} sides")
    if any(f <= 0 for f in figures):
        raise ValueError("choose_children: figures must be positive")
    index: dict = {}
    for label in servers:
        index.setdefault(label, len(index))
    group = np.array([index[label] for label in servers])
    served = int((np.bincount(group) >= 2).sum())
    if served < MIN_SERVERS:
        raise ValueError(f"choose_children needs {MIN_SERVERS} servers of two children or more, got {served}")
    logs = np.log(np.asarray(figures, dtype=float))
    side = np.asarray(sides)
    names = set(sides)
    for name in names:
        logs[side == name] -= logs[side == name].mean()
    # the side means were fitted: each costs the servers' spread a degree of freedom
    return intraclass(logs, group, fitted=len(names)), len(index)


def _times_to_width(counts: Sequence[int], rho: float, pairs: int, alpha: float, server_s: float, child_s: float,
                    ahead: bool) -> dict[int, tuple[int, float]]:
    """Each count of children a server: the server pairs and seconds it takes to reach the
    narrowest interval any count gives at ``pairs`` (inf: not within :data:`HORIZON` times
    ``pairs``); :func:`choose_children` says how."""
    def width(r: int, n: int) -> float:  # the interval's half-width at n pairs, in the processes' sd
        if shared_blocks(n, r) < MIN_BLOCKS:
            return math.inf
        return math.sqrt((1.0 + (r - 1) * rho) / n) * cs_multiplier(n, alpha, units=math.ceil(n / r))

    def pair_s(r: int) -> float:
        waited = max(0.0, server_s - 2 * r * child_s) if ahead else server_s
        return child_s + waited / r

    target = min(width(r, pairs) for r in counts)
    if math.isinf(target):
        raise ValueError(f"choose_children: {pairs} pairs make fewer than {MIN_BLOCKS} server pairs at any count")

    def seconds(r: int) -> tuple[int, float]:
        for n in range(MIN_PAIRS, HORIZON * pairs + 1):
            if width(r, n) <= target * (1.0 + 1e-9):
                return math.ceil(n / r), n * pair_s(r)
        return math.ceil(HORIZON * pairs / r), math.inf

    return {r: seconds(r) for r in counts}


def choose_children(figures: Sequence[float], servers: Sequence[Hashable], sides: Sequence[str], server_s: float,
                    child_s: float, configured: int, pairs: int, alpha: float = DEFAULT_ALPHA,
                    candidates: Sequence[int] = CHILDREN_CANDIDATES, min_gain: float = MIN_GAIN,
                    ahead: bool = False, earlier: tuple[float, int] | None = None) -> ChildrenChoice:
    """The children a fork server to take from now on, from one forked run's processes.

    ``figures``: each forked process's figure (its fastest sample), ``servers`` its server (a
    label unique across sides) and ``sides`` its side; ``server_s``: what starting a server
    costs and ``child_s`` one child (seconds); ``pairs``: the pairs the run's verdict took.
    With ``r`` children a server the variance of the mean grows by ``1 + (r - 1) rho`` (rho:
    the servers' share of the processes' variance, each side's level taken out), a pair costs
    ``child_s + server_s / r`` (``ahead``, servers started ahead of need: ``child_s + max(0,
    server_s - 2 r child_s) / r``, a successor starting while its predecessor's ``r`` children
    and the other side's ``r`` run), and the interval's small-sample widening counts ``ceil(n
    / r)`` server pairs at ``n`` pairs (taken as the units whatever rho is: a run's own
    estimate of rho is above zero about half the time even where layouts do not matter); a
    count whose server pairs of two pairs or more are fewer than :data:`levels.MIN_BLOCKS`
    gives no interval. The width to reach is the narrowest any count gives at ``pairs``; each
    count's time is the pairs it needs to reach that width (up to :data:`HORIZON` times
    ``pairs``: a count with more children a server needs more pairs for as many server
    pairs, but each pair may cost less) times what a pair costs. The configured count stays
    unless another is at least ``min_gain`` faster, and none above it is taken: the server
    level's A/A rate was simulated up to 8 children a server (docs/statistics.md), and a
    count chosen from one run's low estimate of rho would lean on it.

    ``earlier``: the mean of earlier runs' rho and how many runs (weights) it stands for; the
    choice weighs the mean of those and this run's. One run's rho from a few dozen servers
    ranges widely (te:matmul beside six busy loops: 0.00-0.33 in six runs; quiet, 0.34-0.59),
    and a count chosen from one high estimate costs a watch its pairs until the next lesson.
    """
    if server_s < 0 or child_s <= 0 or pairs < 1 or configured < 1:
        raise ValueError("server_s must be >= 0, child_s > 0, pairs and configured >= 1")
    if pairs < MIN_PAIRS:
        raise ValueError(f"choose_children: {pairs} pairs give no interval at any count ({MIN_PAIRS} are needed)")
    own, count = servers_share(figures, servers, sides)
    before, weight = earlier if earlier is not None and earlier[1] > 0 else (0.0, 0)
    rho = (before * weight + own) / (weight + 1)
    counts = sorted({r for r in (*candidates, configured) if r <= configured})
    timed = _times_to_width(counts, rho, pairs, alpha, server_s, child_s, ahead)
    best = min(counts, key=lambda r: (timed[r][1], r))
    base = timed[best][1]
    table = tuple(ChildrenOption(r, units, t / base) for r, (units, t) in timed.items())
    gain = 1.0 - base / timed[configured][1]  # 1.0 where the configured count gives no interval
    keep = gain < min_gain
    chosen = configured if keep else best
    why = (f"configured; no count reaches the same width in {1 - min_gain:.0%} of the time" if keep
           else f"{configured} do not reach that width within {HORIZON}x the pairs" if math.isinf(timed[configured][1])
           else f"{gain:.0%} less time to the same width than {configured}")
    share = (f"{rho:.2f} from {count} servers" if not weight else
             f"{rho:.2f} weighed as {weight + 1} runs, this run's {own:.2f} from {count} servers")
    reason = (f"{chosen} children a fork server ({why}; the servers' share of the variance {share}, a server's start {server_s:.2f} s{' (started ahead)' if ahead else ''}, "
              f"a child {child_s:.2f} s, at {pairs} pairs)")
    return ChildrenChoice(children=chosen, configured=configured, rho=rho, options=table, reason=reason, run_rho=own)
