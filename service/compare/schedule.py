"""How a workload's timed pairs run (``[run] schedule``), decided as a plain value.

``interleaved`` (the default): a pair's two processes one after the other, in ABBA/BAAB order.
``duet``: both at once, each pinned to a core of its own (:mod:`abwatch.runners.duet`), so both
see the same interference; ``duet-one-cpu``: both at once on one CPU, judged on CPU time. A workload marked ``memory_bound`` stays interleaved under duet: its
two sides at once share the memory bandwidth and the caches beyond a core, which slows both
while they overlap and shrinks a difference (docs/statistics.md, "Duet runs"); a kind whose
processes cannot be pinned stays interleaved too. Either way the report says which it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from abwatch.runners.duet import ONE_CPU, Cores

MEMORY_BOUND = ("interleaved, not duet: marked memory_bound (two sides at once share the memory bandwidth, "
                "which shrinks a difference; docs/statistics.md)")


@dataclass(frozen=True)
class Schedule:
    """One workload's schedule: the duet's cores (None: interleaved) and what the report says of
    it, after why the rule stopped ("" for the default, whose reports stay as they were)."""

    cores: Cores | None
    note: str


def schedule_for(asked: str, cores: Cores | None, *, memory_bound: bool, pinnable: bool, kind: str) -> Schedule:
    """The schedule of one workload: ``asked`` (``run.schedule``) on ``cores`` (the host's, chosen
    once a run; None unless asked for a duet, on one CPU or two), unless the workload is ``memory_bound`` or of a
    ``kind`` that cannot be ``pinnable``."""
    if asked not in ("duet", ONE_CPU):
        return Schedule(None, "")
    if cores is None:
        raise ValueError("a duet needs its cores")
    if memory_bound:
        return Schedule(None, MEMORY_BOUND)
    if not pinnable:
        return Schedule(None, f"interleaved, not duet: {kind} workloads' processes cannot be pinned")
    return Schedule(cores, cores.describe())
