"""Decision rules judged side by side on the same data.

abwatch's rule is ``service.stats.sequential_look`` called exactly as the driver calls it:
paired interleaved processes, judged after every batch by an anytime-valid confidence
sequence until decided, out of pairs or out of time. The anchors are the published rules of
other systems, applied as they apply them, to pooled samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as sps

from abwatch.service import stats


@dataclass(frozen=True)
class Trial:
    """One A/B trial: per-process samples, in run order, for both sides (pairs aligned)."""

    control: list[list[float]]  # control[i]: samples of the i-th control process
    treatment: list[list[float]]
    pair_s: list[float] | None = None  # wall seconds of the i-th pair's two processes (real trials)


@dataclass(frozen=True)
class Decision:
    """A rule's answer on one trial: -1 faster, 0 no call, +1 slower; samples it used a side;
    for abwatch also the verdict, its interval (percent), the looks and the seconds taken."""

    call: int
    samples: int
    verdict: str = ""
    change_pct: float | None = None
    ci_pct: tuple[float, float] | None = None
    looks: int = 1
    elapsed_s: float = 0.0


def _pooled(trial: Trial, k: int) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate(trial.control[:k]), np.concatenate(trial.treatment[:k]))


def _direction(a: np.ndarray, b: np.ndarray) -> int:
    return 1 if np.median(b) > np.median(a) else -1


def asv(trial: Trial, k: int) -> Decision:
    """asv: Mann-Whitney p < 0.002 and the ratio beyond asv's default factor 1.1."""
    a, b = _pooled(trial, k)
    p = sps.mannwhitneyu(b, a, alternative="two-sided").pvalue
    ratio = np.median(b) / np.median(a)
    call = _direction(a, b) if p < 0.002 and (ratio > 1.1 or ratio < 1 / 1.1) else 0
    return Decision(call, len(a))


def pinpoint(trial: Trial, k: int) -> Decision:
    """Pinpoint: min(Mann-Whitney, Kolmogorov-Smirnov) p <= 0.01."""
    a, b = _pooled(trial, k)
    p = min(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue, sps.ks_2samp(a, b).pvalue)
    return Decision(_direction(a, b) if p <= 0.01 else 0, len(a))


def lnt(trial: Trial, k: int) -> Decision:
    """LNT: a change of at least 1 % and Mann-Whitney at alpha = 0.05."""
    a, b = _pooled(trial, k)
    change = abs(np.median(b) / np.median(a) - 1)
    p = sps.mannwhitneyu(b, a, alternative="two-sided").pvalue
    return Decision(_direction(a, b) if change >= 0.01 and p < 0.05 else 0, len(a))


def welch(trial: Trial, k: int) -> Decision:
    """Welch's t-test at 0.05 with a 2 % threshold on the means."""
    a, b = _pooled(trial, k)
    change = abs(np.mean(b) / np.mean(a) - 1)
    p = sps.ttest_ind(b, a, equal_var=False).pvalue
    return Decision((1 if np.mean(b) > np.mean(a) else -1) if change >= 0.02 and p < 0.05 else 0, len(a))


@dataclass(frozen=True)
class Budget:
    """abwatch's adaptive schedule: first look, pairs per further look, most pairs a side,
    and the time budget (elapsed time: the trial's wall times, or ``pace_s`` a pair)."""

    start: int = 12
    step: int = 6
    most: int = 36
    max_seconds: float = math.inf
    pace_s: float = 0.0

    @property
    def looks(self) -> int:
        """Looks when nothing is decided before ``most``."""
        return 1 + -(-(self.most - self.start) // self.step)


def abwatch(trial: Trial, budget: Budget, threshold_pct: float = 1.0, alpha: float = 0.01,
            confidence: float = 0.99, seed: int = 0, groups: bool = True) -> Decision:
    """The driver's stopping rule (``stats.sequential_look``) replayed on a trial.

    ``groups=False`` judges the first ``budget.start`` processes' samples pooled, without
    process labels: the path imported records take (one look, Hodges-Lehmann).
    """
    if not groups:
        a, b = _pooled(trial, budget.start)
        v = stats.compare(a, b, threshold_pct=threshold_pct, alpha=alpha, confidence=confidence, seed=seed)
        return _decision(v, len(a), 1, 0.0)
    rule = stats.Budget(max_seconds=budget.max_seconds, max_pairs=min(budget.most, len(trial.control)),
                        batch=budget.step)
    k, look = min(budget.start, len(trial.control)), 0
    while True:
        look += 1
        a = [x for proc in trial.control[:k] for x in proc]
        b = [x for proc in trial.treatment[:k] for x in proc]
        ga = [i for i, proc in enumerate(trial.control[:k]) for _ in proc]
        gb = [i for i, proc in enumerate(trial.treatment[:k]) for _ in proc]
        elapsed = sum(trial.pair_s[:k]) if trial.pair_s else k * budget.pace_s
        step = stats.sequential_look(a, b, ga, gb, look=look, elapsed_s=elapsed, budget=rule,
                                     threshold_pct=threshold_pct, alpha=alpha, confidence=confidence,
                                     seed=seed, plan_pairs=max(stats.DEFAULT_PLAN_PAIRS, budget.start))
        if step.stop:
            return _decision(step.verdict, len(a), look, elapsed)
        k += step.next_pairs


def _decision(v: stats.Verdict, samples: int, looks: int, elapsed: float) -> Decision:
    call = {stats.Outcome.REGRESSION: 1, stats.Outcome.IMPROVEMENT: -1}.get(v.verdict, 0)
    return Decision(call, samples, v.verdict.value, v.change_pct, v.ci_pct, looks, elapsed)


ANCHORS: dict[str, Callable[[Trial, int], Decision]] = {
    "asv (MWU p<0.002, x1.1)": asv,
    "Pinpoint (min(MWU,KS) p<=0.01)": pinpoint,
    "LNT (>=1%, MWU a=0.05)": lnt,
    "Welch t (>=2%, a=0.05)": welch,
}


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def rate(calls: Sequence[int], want: int) -> str:
    """'x.x% [lo, hi]' of calls equal to ``want`` (for A/A: any non-zero call)."""
    hits = sum(1 for c in calls if (c != 0 if want == 0 else c == want))
    lo, hi = wilson(hits, len(calls))
    return f"{100 * hits / len(calls):5.1f}% [{100 * lo:4.1f}, {100 * hi:5.1f}]"
