"""Decision rules judged side by side on the same data.

abwatch's rule is ``service.stats.compare`` used exactly as the driver uses it: paired
interleaved processes, adaptive looks at Bonferroni-corrected levels. The anchors are the
published rules of other systems, applied as they apply them, to pooled samples.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Decision:
    """A rule's answer on one trial: -1 faster, 0 no call, +1 slower; samples it used a side."""

    call: int
    samples: int


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
    """abwatch's adaptive schedule: first look, step, most processes a side."""

    start: int = 12
    step: int = 6
    most: int = 36

    @property
    def looks(self) -> int:
        return 1 + -(-(self.most - self.start) // self.step)


def abwatch(trial: Trial, budget: Budget, threshold_pct: float = 1.0, alpha: float = 0.01,
            confidence: float = 0.99, seed: int = 0) -> Decision:
    """``service.stats.compare`` with the driver's options, looking again until decided."""
    a_level, c_level = stats.sequential_levels(alpha, confidence, budget.looks)
    k = budget.start
    while True:
        a = [x for proc in trial.control[:k] for x in proc]
        b = [x for proc in trial.treatment[:k] for x in proc]
        ga = [i for i, proc in enumerate(trial.control[:k]) for _ in proc]
        gb = [i for i, proc in enumerate(trial.treatment[:k]) for _ in proc]
        v = stats.compare(a, b, threshold_pct=threshold_pct, alpha=a_level, confidence=c_level,
                          resamples=500, seed=seed, control_groups=ga, treatment_groups=gb, paired=True)
        if v.verdict != stats.Outcome.UNKNOWN or k >= budget.most:
            call = {stats.Outcome.REGRESSION: 1, stats.Outcome.IMPROVEMENT: -1}.get(v.verdict, 0)
            return Decision(call, len(a))
        k = min(budget.most, k + budget.step)


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
