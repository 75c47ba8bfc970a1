"""How contended a measurement was, and what a verdict taken under heavy contention may say.

Wall time of a short process on an oversubscribed host is quantized by the scheduler's
time slices: at load 8 on 2 cores a 4 ms sample waits one or two slices of other processes
(~3 ms each) for every slice it runs, so a +20 % change in work showed as +3 % in one run and
+98 % in another. Each measured process says how contended it was: the CPU time it used
against its wall time (``cpu_share``: 1.0 alone on a core, ~0.12 at load 8 on 2 cores) and
the involuntary context switches per CPU second (the kernel taking the CPU from it: near 0
alone, ~300 at load 8). A process that waits on I/O or sleeps also has a low share, but
gives the CPU up voluntarily; only both signs together are contention. A long sample is
contended at a high share too: a fork server's child beside six busy loops kept 92 % of its
wall time but was preempted ~5 times in each 55 ms sample, so none of its samples was the
clean one its fastest sample stands for (:func:`unclean_chance`).

Under heavy contention (:func:`assess`) a verdict is judged on the CPU time of each process
instead (:func:`on_cpu_time`), which waiting for a CPU does not inflate; where the workload's
kind does not measure CPU time the verdict is refused as ``unknown`` with the reason
(:func:`refused`). docs/statistics.md argues the choice and gives the measurements.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from abwatch.service.stats.verdict import Outcome, Verdict

HEAVY_SHARE = 0.5  # a process that ran less than half of its life on a CPU ...
HEAVY_PREEMPTIONS = 10.0  # ... and was taken off it at least this often per CPU second
# ... or was preempted so often for its samples' length that it most likely had no sample the
# scheduler left alone (the chance that none was, median across processes, at least this)
HEAVY_UNCLEAN = 0.5
MIN_PROCESSES = 3  # fewer processes with figures than this: contention is not assessed
CPU_UNIT = "cpu ms"  # a verdict's unit when it was judged on CPU time per process
CPU_ESTIMATOR = ("CPU time (user + system) per process, median across the control's processes; "
                 "treatment = control x (1 + judged change)")
CPU_SAMPLE_ESTIMATOR = ("mean of the faster half of its samples' CPU times (user + system) per process, median "
                        "across the control's processes; treatment = control x (1 + judged change)")


@dataclass(frozen=True)
class Contention:
    """How contended the measured processes of a comparison were (medians across them)."""

    processes: int  # measured processes with CPU figures
    cpu_share: float | None  # CPU time / wall time, per thread (None: not measured)
    preemptions_per_cpu_s: float | None  # involuntary context switches per CPU second
    heavy: bool
    max_share: float = HEAVY_SHARE  # the rule it was judged by
    min_preemptions: float = HEAVY_PREEMPTIONS
    # preemptions expected in a process's fastest sample, and the chance that none of its
    # samples ran unpreempted (medians; None: the samples were not given)
    preemptions_per_sample: float | None = None
    unclean: float | None = None

    def describe(self) -> str:
        """One phrase for a report: the figures and whether they count as heavy."""
        if self.cpu_share is None or self.preemptions_per_cpu_s is None:
            return "contention not measured"
        word = "heavy contention" if self.heavy else "contention"
        said = (f"{word}: the processes ran {self.cpu_share:.0%} of their wall time on a CPU and were "
                f"preempted {self.preemptions_per_cpu_s:.0f} times per CPU second")
        if self.unclean is not None and self.preemptions_per_sample is not None and self.unclean >= HEAVY_UNCLEAN:
            said += (f", {self.preemptions_per_sample:.1f} times a sample (a process had no sample left alone, "
                     f"{self.unclean:.0%} likely)")
        return said

    def to_dict(self) -> dict[str, Any]:
        """As stored in a comparison's details and shown in ``--json`` and alerts."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Contention:
        """The contention :meth:`to_dict` gave."""
        return cls(**{key: data[key] for key in ("processes", "cpu_share", "preemptions_per_cpu_s", "heavy",
                                                 "max_share", "min_preemptions", "preemptions_per_sample",
                                                 "unclean") if key in data})


def unclean_chance(preemptions_per_cpu_s: float, sample_s: float, samples: int) -> float:
    """The chance that none of a process's ``samples`` samples of ``sample_s`` seconds of CPU
    ran without a preemption, where preemptions come at ``preemptions_per_cpu_s`` per CPU
    second (a Poisson process): the fastest sample is then not a clean one, and how many time
    slices of others it carries is a draw."""
    return (-math.expm1(-preemptions_per_cpu_s * sample_s)) ** samples


def assess(wall_s: Sequence[float], cpu_s: Sequence[float | None], switches: Sequence[int | None], *,
           max_share: float = HEAVY_SHARE, min_preemptions: float = HEAVY_PREEMPTIONS,
           fastest_s: Sequence[float | None] | None = None, samples: Sequence[int] | None = None) -> Contention:
    """The contention of processes given as parallel sequences of wall time, CPU time and
    involuntary switches (None: not measured), and optionally each one's fastest sample
    (seconds) and number of samples. Heavy when the median rate of preemptions is at least
    ``min_preemptions`` per CPU second and either the median share of wall time on a CPU is
    below ``max_share`` or, median across processes, a process most likely had no sample
    without a preemption (:data:`HEAVY_UNCLEAN`, :func:`unclean_chance`); processes without
    figures are left out, fewer than :data:`MIN_PROCESSES` with figures are never heavy, and
    ``max_share`` 0 is never heavy."""
    count = len(wall_s)
    if not len(cpu_s) == len(switches) == count or any(s is not None and len(s) != count for s in (fastest_s, samples)):
        raise ValueError("wall_s, cpu_s, switches, fastest_s and samples must be parallel sequences")
    fastest = list(fastest_s) if fastest_s is not None else [None] * count
    taken = list(samples) if samples is not None else [0] * count
    measured = [(w, c, n, f, k) for w, c, n, f, k in zip(wall_s, cpu_s, switches, fastest, taken, strict=True)
                if c is not None and n is not None and w > 0]
    if len(measured) < MIN_PROCESSES:
        return Contention(len(measured), None, None, False, max_share, min_preemptions)
    share = statistics.median(c / w for w, c, *_ in measured)
    # a CPU time of 0 (a process that did nothing measurable) counts as one millisecond
    rates = [n / max(c, 1e-3) for _, c, n, *_ in measured]
    rate = statistics.median(rates)
    per_sample = unclean = None
    timed = [(r, f, k) for r, (*_, f, k) in zip(rates, measured, strict=True) if f is not None and k > 0]
    if len(timed) == len(measured):
        per_sample = statistics.median(r * f for r, f, _ in timed)
        unclean = statistics.median(unclean_chance(r, f, k) for r, f, k in timed)
    crowded = share < max_share or (max_share > 0 and unclean is not None and unclean >= HEAVY_UNCLEAN)
    return Contention(len(measured), share, rate, crowded and rate >= min_preemptions,
                      max_share, min_preemptions, per_sample, unclean)


def cpu_figure(samples: Sequence[float]) -> float:
    """What a process is judged by of its samples' own CPU times: the mean of the faster half
    (of 5 samples, the fastest 2). Waiting does not stretch a sample's CPU time, but the
    caches and memory bandwidth the neighbours take do, and they slow a sample far more often
    than they speed one: beside six busy loops builtin:mlp's 5 samples a process lay a median
    0.2, 0.6, 1.0 and 1.8 % above each process's fastest, the slowest 4.7 % at the 90th
    percentile. The mean keeps that tail; the fastest alone is one draw of the noise (of 100
    samples, an outlier). Replayed on the same processes of 40 runs, the faster half's
    intervals were a median 0.83 times the mean's (docs/statistics.md)."""
    if not samples:
        raise ValueError("a process without samples has no CPU figure")
    return statistics.fmean(sorted(samples)[:max(1, len(samples) // 2)])


def on_cpu_time(verdict: Verdict, contention: Contention, per_sample: bool = False,
                because: str | None = None) -> Verdict:
    """A verdict judged on CPU time, saying why (its unit is :data:`CPU_UNIT`): per process, or
    with ``per_sample`` on each process's samples in CPU time (:func:`cpu_figure`); ``because``:
    why CPU time, where not the contention (a duet on one CPU)."""
    what = "each process's faster half of samples in CPU time" if per_sample else "CPU time per process"
    caveat = f"{because or contention.describe()}: judged on {what}, which waiting for a CPU does not inflate"
    return replace(verdict, unit=CPU_UNIT, estimator=CPU_SAMPLE_ESTIMATOR if per_sample else CPU_ESTIMATOR,
                   caveat=caveat, reason=f"{caveat}; {verdict.reason}")


def refused(verdict: Verdict, contention: Contention,
            why: str = "processes have no CPU time to judge on", because: str | None = None) -> Verdict:
    """``unknown`` in place of a wall-time verdict taken under heavy contention (or ``because``
    of something else that shares the CPU: a duet on one CPU) with no CPU time to judge on
    (``why``: what this workload's processes lack): a size the scheduler's time slices can
    inflate is not reported."""
    caveat = (f"{because or contention.describe()}, and this workload's {why}: "
              "a wall-time change measured so cannot be stood behind")
    said = verdict.verdict.value + (f" {verdict.change_pct:+.1f}%" if verdict.change_pct is not None else "")
    return replace(verdict, verdict=Outcome.UNKNOWN, change_pct=None, ci_pct=None, p_value=None,
                   p_adjusted=None, same_ci_pct=None, treatment_ms=None, caveat=caveat,
                   reason=f"not judged: {caveat} (wall time said: {said})")
