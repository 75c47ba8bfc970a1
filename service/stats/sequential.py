"""The stopping rule: after each batch of paired processes, decide, stop, or say how many more.

The driver and the ground-truth suite both call :func:`sequential_look` after each batch.
The verdict comes from :func:`service.stats.core.compare` on the paired path, whose
confidence sequence is valid at every look, so looking as often as we like costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Sequence

from abwatch.service.stats.core import compare
from abwatch.service.stats.verdict import Outcome, Verdict


@dataclass(frozen=True)
class Budget:
    """What one workload may spend on measuring: seconds, an optional cap on pairs, and
    the pairs added per look."""

    max_seconds: float
    max_pairs: int | None = None
    batch: int = 6

    def __post_init__(self) -> None:
        if self.max_seconds <= 0 or self.batch < 1 or (self.max_pairs is not None and self.max_pairs < 1):
            raise ValueError(f"invalid budget {self}")


@dataclass(frozen=True)
class Look:
    """One look of :func:`sequential_look`: the verdict so far, whether to stop, and how many
    pairs the next batch should add (0 when stopping)."""

    verdict: Verdict
    stop: bool
    next_pairs: int


def sequential_look(control: Sequence[float], treatment: Sequence[float], control_groups: Sequence,
                    treatment_groups: Sequence, *, look: int, elapsed_s: float, budget: Budget,
                    **options) -> Look:
    """The stopping rule: judge paired processes, then stop or say how big the next batch is.

    The verdict comes from :func:`compare` (``paired=True``; ``options`` are its keyword
    arguments), whose confidence sequence is valid at every look, so the rule may be called
    after every batch without a fixed number of looks. It stops when the verdict is decided,
    when the cap on pairs is reached, or when the next pair would not fit into the time
    budget at the pace measured so far (``elapsed_s`` over the pairs done, warm-up included).
    """
    if look < 1:
        raise ValueError("look counts from 1")
    verdict = compare(control, treatment, control_groups=control_groups, treatment_groups=treatment_groups,
                      paired=True, **options)
    pairs = min(len(set(control_groups)), len(set(treatment_groups)))
    verdict = replace(verdict, looks=look, elapsed_s=elapsed_s)
    where = f"look {look}, {pairs} pairs, {elapsed_s:.1f}s"
    if verdict.verdict != Outcome.UNKNOWN:
        return Look(replace(verdict, stop_reason=f"decided at {where}"), True, 0)
    room = budget.batch if budget.max_pairs is None else min(budget.batch, budget.max_pairs - pairs)
    if room <= 0:
        return Look(replace(verdict, stop_reason=f"invocation cap reached ({budget.max_pairs} a side) at {where}"),
                    True, 0)
    pace = elapsed_s / max(pairs, 1)
    affordable = room if pace <= 0 else int((budget.max_seconds - elapsed_s) // pace)
    if affordable < 1:
        return Look(replace(verdict, stop_reason=f"time budget spent ({budget.max_seconds:g}s) at {where}"), True, 0)
    return Look(verdict, False, min(room, affordable))
