"""How contended a measurement was, and what a verdict taken under heavy contention may say.

Wall time of a short process on an oversubscribed host is quantized by the scheduler's
time slices: at load 8 on 2 cores a 4 ms sample waits one or two slices of other processes
(~3 ms each) for every slice it runs, so a +20 % change in work showed as +3 % in one run and
+98 % in another. Each measured process says how contended it was: the CPU time it used
against its wall time (``cpu_share``: 1.0 alone on a core, ~0.12 at load 8 on 2 cores) and
the involuntary context switches per CPU second (the kernel taking the CPU from it: near 0
alone, ~300 at load 8). A process that waits on I/O or sleeps also has a low share, but
gives the CPU up voluntarily; only both signs together are contention.

Under heavy contention (:func:`assess`) a verdict is judged on the CPU time of each process
instead (:func:`on_cpu_time`), which waiting for a CPU does not inflate; where the workload's
kind does not measure CPU time the verdict is refused as ``unknown`` with the reason
(:func:`refused`). docs/statistics.md argues the choice and gives the measurements.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from abwatch.service.stats.verdict import Outcome, Verdict

HEAVY_SHARE = 0.5  # a process that ran less than half of its life on a CPU ...
HEAVY_PREEMPTIONS = 10.0  # ... and was taken off it at least this often per CPU second
MIN_PROCESSES = 3  # fewer processes with figures than this: contention is not assessed
CPU_UNIT = "cpu ms"  # a verdict's unit when it was judged on CPU time per process
CPU_ESTIMATOR = ("CPU time (user + system) per process, median across the control's processes; "
                 "treatment = control x (1 + judged change)")


@dataclass(frozen=True)
class Contention:
    """How contended the measured processes of a comparison were (medians across them)."""

    processes: int  # measured processes with CPU figures
    cpu_share: float | None  # CPU time / wall time, per thread (None: not measured)
    preemptions_per_cpu_s: float | None  # involuntary context switches per CPU second
    heavy: bool
    max_share: float = HEAVY_SHARE  # the rule it was judged by
    min_preemptions: float = HEAVY_PREEMPTIONS

    def describe(self) -> str:
        """One phrase for a report: the figures and whether they count as heavy."""
        if self.cpu_share is None or self.preemptions_per_cpu_s is None:
            return "contention not measured"
        word = "heavy contention" if self.heavy else "contention"
        return (f"{word}: the processes ran {self.cpu_share:.0%} of their wall time on a CPU and were "
                f"preempted {self.preemptions_per_cpu_s:.0f} times per CPU second")

    def to_dict(self) -> dict[str, Any]:
        """As stored in a comparison's details and shown in ``--json`` and alerts."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Contention:
        """The contention :meth:`to_dict` gave."""
        return cls(**{key: data[key] for key in ("processes", "cpu_share", "preemptions_per_cpu_s", "heavy",
                                                 "max_share", "min_preemptions") if key in data})


def assess(wall_s: Sequence[float], cpu_s: Sequence[float | None], switches: Sequence[int | None], *,
           max_share: float = HEAVY_SHARE, min_preemptions: float = HEAVY_PREEMPTIONS) -> Contention:
    """The contention of processes given as parallel sequences of wall time, CPU time and
    involuntary switches (None: not measured). Heavy when the median share of wall time on a
    CPU is below ``max_share`` and the median rate of preemptions at least ``min_preemptions``
    per CPU second; processes without figures are left out, and fewer than
    :data:`MIN_PROCESSES` with figures are never heavy."""
    if not len(wall_s) == len(cpu_s) == len(switches):
        raise ValueError("wall_s, cpu_s and switches must be parallel sequences")
    measured = [(w, c, n) for w, c, n in zip(wall_s, cpu_s, switches, strict=True) if c is not None and n is not None and w > 0]
    if len(measured) < MIN_PROCESSES:
        return Contention(len(measured), None, None, False, max_share, min_preemptions)
    share = statistics.median(c / w for w, c, _ in measured)
    # a CPU time of 0 (a process that did nothing measurable) counts as one millisecond
    rate = statistics.median(n / max(c, 1e-3) for _, c, n in measured)
    return Contention(len(measured), share, rate, share < max_share and rate >= min_preemptions,
                      max_share, min_preemptions)


def on_cpu_time(verdict: Verdict, contention: Contention) -> Verdict:
    """A verdict judged on CPU time per process, saying why (its unit is :data:`CPU_UNIT`)."""
    caveat = (f"{contention.describe()}: judged on CPU time per process, which waiting for a CPU "
              "does not inflate")
    return replace(verdict, unit=CPU_UNIT, estimator=CPU_ESTIMATOR, caveat=caveat, reason=f"{caveat}; {verdict.reason}")


def refused(verdict: Verdict, contention: Contention,
            why: str = "processes have no CPU time to judge on") -> Verdict:
    """``unknown`` in place of a wall-time verdict taken under heavy contention with no CPU
    time to judge on (``why``: what this workload's processes lack): a size the scheduler's
    time slices can inflate is not reported."""
    caveat = (f"{contention.describe()}, and this workload's {why}: "
              "a wall-time change measured so cannot be stood behind")
    said = verdict.verdict.value + (f" {verdict.change_pct:+.1f}%" if verdict.change_pct is not None else "")
    return replace(verdict, verdict=Outcome.UNKNOWN, change_pct=None, ci_pct=None, p_value=None,
                   p_adjusted=None, same_ci_pct=None, treatment_ms=None, caveat=caveat,
                   reason=f"not judged: {caveat} (wall time said: {said})")
