"""The unpaired estimation paths of :func:`service.stats.core.compare`, one function each.

:func:`~service.stats.core.compare` picks the path from the samples' shape (see its module
docstring); each path here turns the two sides into an :class:`Estimate` (the change, its
interval, the p-value and the method's name), which the decision rule then judges. The paired
path lives with the confidence sequence it needs (:mod:`service.stats.core`). Pure functions over
numpy arrays; no database, no I/O. Each path that resamples seeds a generator of its own from
``seed``: a comparison's result depends on its inputs alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from abwatch.service.stats.pooled import (
    POOLED_METHOD, QUANTILE, SMALL_POOLED_METHOD, hodges_lehmann, quantile_shift,
)

IDENTICAL_METHOD = "identical samples"
SAMPLE_BOOTSTRAP_METHOD = "ratio of medians, sample bootstrap; Mann-Whitney U"
PROCESS_BOOTSTRAP_METHOD = "ratio of medians, process bootstrap; Mann-Whitney U on process medians"


@dataclass(frozen=True)
class Estimate:
    """What one estimation path found: the change (%), its interval (%), the p-value of "no
    change", and the method that found them (shown with the verdict)."""

    change: float
    ci: tuple[float, float]
    p_value: float
    method: str


def identical(change: float, med_a: float, med_b: float) -> Estimate:
    """No spread on either side: the bootstrap and the rank test have nothing to resample, so
    the change is exact and certain."""
    return Estimate(change, (change, change), 1.0 if med_a == med_b else 0.0, IDENTICAL_METHOD)


def quantile(a: np.ndarray, b: np.ndarray, confidence: float, higher_is_better: bool) -> Estimate:
    """Pooled samples, enough of them: the shift of the clean tail (the fast one of times, the
    high one of a rate; :func:`service.stats.pooled.quantile_shift`)."""
    change, ci, p_value = quantile_shift(a, b, confidence, 1.0 - QUANTILE if higher_is_better else QUANTILE)
    return Estimate(change, ci, p_value, POOLED_METHOD)


def small_pooled(a: np.ndarray, b: np.ndarray, confidence: float, seed: int) -> Estimate:
    """Pooled samples, too few for a tail quantile: the Hodges-Lehmann shift."""
    change, ci, p_value = hodges_lehmann(a, b, confidence, np.random.default_rng(seed))
    return Estimate(change, ci, p_value, SMALL_POOLED_METHOD)


def _ratio_of_medians(control: np.ndarray, treatment: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(treatment, axis=axis) / np.median(control, axis=axis)


def sample_bootstrap(a: np.ndarray, b: np.ndarray, change: float, resamples: int, confidence: float,
                     seed: int) -> Estimate:
    """One sample per unit with zeros among them (no log scale): the ratio of medians with a
    percentile bootstrap over samples, and Mann-Whitney's p-value."""
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    boot = sps.bootstrap(
        (a, b), _ratio_of_medians, n_resamples=resamples, confidence_level=confidence,
        method="percentile", vectorized=True, rng=np.random.default_rng(seed),
    )
    low, high = boot.confidence_interval
    ci = ((float(low) - 1.0) * 100.0, (float(high) - 1.0) * 100.0)
    p_value = float(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    return Estimate(change, ci, p_value, SAMPLE_BOOTSTRAP_METHOD)


def process_bootstrap(ca: np.ndarray, cb: np.ndarray, change: float, resamples: int, confidence: float,
                      seed: int) -> Estimate:
    """Samples grouped by process, not paired: the ratio of medians with a bootstrap over whole
    processes (the rows of ``ca`` and ``cb``), and Mann-Whitney's p-value on the process medians."""
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    low, high = _cluster_bootstrap(ca, cb, resamples, confidence, np.random.default_rng(seed))
    ci = ((low - 1.0) * 100.0, (high - 1.0) * 100.0)
    p_value = float(sps.mannwhitneyu(np.nanmedian(cb, axis=1), np.nanmedian(ca, axis=1),
                                     alternative="two-sided").pvalue)
    # all process medians tied: the rank test has no answer, which is no evidence of a change
    return Estimate(change, ci, 1.0 if np.isnan(p_value) else p_value, PROCESS_BOOTSTRAP_METHOD)


def _cluster_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int, confidence: float,
                       rng: np.random.Generator) -> tuple[float, float]:
    """Percentile interval of the ratio of medians, resampling whole clusters (rows)."""
    ia = rng.integers(0, len(a), size=(resamples, len(a)))
    ib = rng.integers(0, len(b), size=(resamples, len(b)))
    ratio = (np.nanmedian(b[ib].reshape(resamples, -1), axis=1)
             / np.nanmedian(a[ia].reshape(resamples, -1), axis=1))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratio, [tail, 100.0 - tail])
    return float(low), float(high)
