"""Statistics: is the treatment slower, faster, the same, or is it too early to say?

Pure functions over plain sequences of milliseconds; no database, no I/O. The effect is
the ratio of medians (robust to the pre-empted, ~2x slower samples a busy machine
produces), with a bootstrap confidence interval; the p-value is Mann-Whitney U's.

Samples from one process are not independent: on a busy machine whole processes run a
few percent fast or slow, and slow phases last several processes. When the caller says
which process (invocation) each sample came from (``control_groups``/``treatment_groups``),
the process is the unit: the bootstrap resamples whole processes and Mann-Whitney compares
per-process medians. When the processes ran in interleaved pairs (``paired=True``, what
the runner does), each treatment process is compared with the control process that ran
next to it, which cancels the slow phases: the effect is the trimmed mean of the pairs'
log ratios, the interval resamples pairs, and the test is Wilcoxon's signed-rank.
Without groups every sample is its own unit (ratio of medians, Mann-Whitney on samples).

Decision rule, with ``t`` the threshold (the smallest change worth reporting):

* ``regression``  – the CI lies above 0, p < alpha, and the estimate is at least +t %;
* ``improvement`` – the mirror image;
* ``same``        – the whole CI lies within (-t %, +t %): any change is smaller than t,
  with confidence (an equivalence statement, not merely "nothing found");
* ``unknown``     – anything else: not enough evidence either way.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from scipy import stats as sps

DEFAULT_THRESHOLD_PCT = 1.0
DEFAULT_ALPHA = 0.01
DEFAULT_CONFIDENCE = 0.99
DEFAULT_RESAMPLES = 2000
MIN_SAMPLES = 5


class Outcome(str, enum.Enum):
    """The four answers; values are the strings stored and printed."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Verdict:
    """The result of :func:`compare` (percentages are of the control's median)."""

    verdict: Outcome
    change_pct: float | None
    ci_pct: tuple[float, float] | None
    p_value: float | None
    control_n: int
    treatment_n: int
    control_median_ms: float | None
    treatment_median_ms: float | None
    threshold_pct: float
    alpha: float
    confidence: float
    reason: str
    p_adjusted: float | None = None  # after a multiple-comparison correction, if one was applied
    correction: str = "none"
    stop_reason: str = ""  # why the runner stopped adding samples (set by adaptive callers)


def sequential_levels(alpha: float, confidence: float, looks: int) -> tuple[float, float]:
    """Per-look alpha and CI level when the data may be judged up to ``looks`` times.

    Bonferroni alpha spending: each look gets alpha / looks (and the interval the matching
    level), so stopping at the first decisive look keeps the overall error rate at alpha
    however many looks are taken. Conservative, but valid without further assumptions.
    """
    if looks < 1:
        raise ValueError("looks must be >= 1")
    return alpha / looks, 1.0 - (1.0 - confidence) / looks


def _as_samples(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(list(values), dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a flat sequence of milliseconds")
    bad = ~np.isfinite(array)
    if bad.any():
        raise ValueError(f"{name}: sample {int(np.argmax(bad))} is {array[bad][0]!r}; samples must be finite")
    if (array < 0).any():
        raise ValueError(f"{name}: sample {int(np.argmax(array < 0))} is negative")
    return array


def _ratio_of_medians(control: np.ndarray, treatment: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(treatment, axis=axis) / np.median(control, axis=axis)


def _clusters(samples: np.ndarray, groups: Sequence | None, name: str) -> np.ndarray:
    """Samples as a (clusters, max size) array padded with NaN; one cluster per sample if no groups."""
    if groups is None:
        return samples.reshape(-1, 1)
    groups = list(groups)
    if len(groups) != len(samples):
        raise ValueError(f"{name}_groups: {len(groups)} labels for {len(samples)} samples")
    order: dict = {}
    for label in groups:
        order.setdefault(label, len(order))
    rows = [[] for _ in order]
    for value, label in zip(samples, groups):
        rows[order[label]].append(value)
    out = np.full((len(rows), max(map(len, rows))), np.nan)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


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


def compare(
    control: Sequence[float],
    treatment: Sequence[float],
    *,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    alpha: float = DEFAULT_ALPHA,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    min_samples: int = MIN_SAMPLES,
    seed: int = 0,
    control_groups: Sequence | None = None,
    treatment_groups: Sequence | None = None,
    paired: bool = False,
) -> Verdict:
    """Judge ``treatment`` against ``control`` (both sequences of milliseconds).

    ``*_groups`` optionally label each sample with the process it came from (see the
    module docstring); with them, at least ``min_samples`` samples and 3 processes a side
    are needed for a verdict. ``paired`` says the i-th control process ran next to the
    i-th treatment process (one interleaved pair), so their ratio cancels what the machine
    was doing at that moment.
    """
    if threshold_pct <= 0:
        raise ValueError("threshold_pct must be > 0")
    if not 0 < alpha < 1 or not 0 < confidence < 1:
        raise ValueError("alpha and confidence must lie in (0, 1)")
    a = _as_samples(control, "control")
    b = _as_samples(treatment, "treatment")
    params = dict(threshold_pct=threshold_pct, alpha=alpha, confidence=confidence)
    base = dict(control_n=len(a), treatment_n=len(b), **params)
    ca, cb = _clusters(a, control_groups, "control"), _clusters(b, treatment_groups, "treatment")
    min_clusters = 3 if control_groups is not None or treatment_groups is not None else min_samples
    if len(a) < min_samples or len(b) < min_samples or min(len(ca), len(cb)) < min_clusters:
        return Verdict(
            Outcome.UNKNOWN, None, None, None,
            control_median_ms=float(np.median(a)) if len(a) else None,
            treatment_median_ms=float(np.median(b)) if len(b) else None,
            reason=(f"too few samples (need {min_samples} a side in {min_clusters} processes, have "
                    f"{len(a)} in {len(ca)} and {len(b)} in {len(cb)})"),
            **base,
        )
    med_a, med_b = float(np.median(a)), float(np.median(b))
    base.update(control_median_ms=med_a, treatment_median_ms=med_b)
    if med_a <= 0:
        return Verdict(Outcome.UNKNOWN, None, None, None,
                       reason="control median is 0 ms; a relative change is undefined", **base)

    change = (med_b / med_a - 1.0) * 100.0
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        # No spread at all: the bootstrap and the rank test have nothing to resample.
        ci = (change, change)
        p_value = 1.0 if med_a == med_b else 0.0
    elif paired and control_groups is not None and treatment_groups is not None and _positive(ca, cb):
        change, ci, p_value = _paired(ca, cb, resamples, confidence, np.random.default_rng(seed))
    elif ca.shape[1] == 1 and cb.shape[1] == 1:  # one sample per unit: scipy's bootstrap
        boot = sps.bootstrap(
            (a, b), _ratio_of_medians, n_resamples=resamples, confidence_level=confidence,
            method="percentile", vectorized=True, rng=np.random.default_rng(seed),
        )
        low, high = boot.confidence_interval
        ci = ((float(low) - 1.0) * 100.0, (float(high) - 1.0) * 100.0)
        p_value = float(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    else:
        low, high = _cluster_bootstrap(ca, cb, resamples, confidence, np.random.default_rng(seed))
        ci = ((low - 1.0) * 100.0, (high - 1.0) * 100.0)
        p_value = float(sps.mannwhitneyu(np.nanmedian(cb, axis=1), np.nanmedian(ca, axis=1),
                                         alternative="two-sided").pvalue)
        if math.isnan(p_value):
            p_value = 1.0
    return _decide(change, ci, p_value, base)


def _positive(ca: np.ndarray, cb: np.ndarray) -> bool:
    return bool((np.nanmedian(ca, axis=1) > 0).all() and (np.nanmedian(cb, axis=1) > 0).all())


def _paired(ca: np.ndarray, cb: np.ndarray, resamples: int, confidence: float,
            rng: np.random.Generator) -> tuple[float, tuple[float, float], float]:
    """Change, CI and p-value from the log ratios of paired process medians.

    The estimate is the 10 %-trimmed mean of the log ratios (a whole process pre-empted on
    one side of a pair is trimmed away); its interval resamples pairs; the p-value is
    Wilcoxon's signed-rank test on the log ratios.
    """
    k = min(len(ca), len(cb))
    d = np.log(np.nanmedian(cb[:k], axis=1) / np.nanmedian(ca[:k], axis=1))
    estimate = float(sps.trim_mean(d, 0.1))
    boot = sps.trim_mean(d[rng.integers(0, k, size=(resamples, k))], 0.1, axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    p_value = float(sps.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    pct = lambda x: (math.exp(x) - 1.0) * 100.0  # noqa: E731 - log ratio to percent
    return pct(estimate), (pct(low), pct(high)), p_value if not math.isnan(p_value) else 1.0


def _decide(change: float, ci: tuple[float, float], p_value: float, base: dict,
            p_decide: float | None = None) -> Verdict:
    """Apply the decision rule; ``p_decide`` (an adjusted p-value) replaces ``p_value`` if given."""
    t, alpha = base["threshold_pct"], base["alpha"]
    p = p_value if p_decide is None else p_decide
    low, high = ci
    if low > 0 and p < alpha and change >= t:
        outcome, reason = Outcome.REGRESSION, f"slower by {change:.2f}% (CI above 0, p={p:.2g})"
    elif high < 0 and p < alpha and change <= -t:
        outcome, reason = Outcome.IMPROVEMENT, f"faster by {-change:.2f}% (CI below 0, p={p:.2g})"
    elif -t < low and high < t:
        outcome, reason = Outcome.SAME, f"any change is within ±{t:g}% (CI {low:.2f}..{high:.2f}%)"
    else:
        outcome, reason = Outcome.UNKNOWN, f"inconclusive (CI {low:.2f}..{high:.2f}%, p={p:.2g})"
    return Verdict(outcome, change, (low, high), p_value, reason=reason, **base)


def adjust_fdr(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Control the false discovery rate across one run's comparisons (Benjamini-Hochberg).

    Every verdict that has a p-value is decided again with its BH-adjusted p-value, so a
    run of many workloads does not flag more of them by chance than one workload would.
    Verdicts without a p-value (too few samples, failures) pass through unchanged.
    """
    tested = [i for i, v in enumerate(verdicts) if v.p_value is not None]
    out = list(verdicts)
    if not tested:
        return out
    adjusted = sps.false_discovery_control([verdicts[i].p_value for i in tested], method="bh")
    for i, p_adj in zip(tested, adjusted):
        v = verdicts[i]
        base = dict(control_n=v.control_n, treatment_n=v.treatment_n,
                    control_median_ms=v.control_median_ms, treatment_median_ms=v.treatment_median_ms,
                    threshold_pct=v.threshold_pct, alpha=v.alpha, confidence=v.confidence)
        decided = _decide(v.change_pct, v.ci_pct, v.p_value, base, p_decide=float(p_adj))
        # the reason names the p that decided, so it is not mistaken for the raw one
        out[i] = replace(decided, p_adjusted=float(p_adj), correction="benjamini-hochberg",
                         stop_reason=v.stop_reason, reason=decided.reason.replace("p=", "BH-adjusted p="))
    return out


def process_cv(samples: Sequence[float], groups: Sequence) -> float:
    """Coefficient of variation of per-process medians: the noise the verdict works against."""
    clusters = _clusters(_as_samples(samples, "samples"), groups, "samples")
    medians = np.nanmedian(clusters, axis=1)
    if len(medians) < 2 or np.mean(medians) <= 0:
        raise ValueError("process_cv needs at least 2 processes with a positive mean")
    return float(np.std(medians, ddof=1) / np.mean(medians))


def planned_repetitions(cv: float, target_pct: float, alpha: float, power: float = 0.95) -> int:
    """Processes per side needed to detect a ``target_pct`` change with ``power``.

    The normal approximation for two groups, k = 2 (z_{1-alpha/2} + z_power)^2 (cv/target)^2,
    divided by Mann-Whitney's asymptotic efficiency against the t-test (3/pi).
    """
    if cv < 0 or target_pct <= 0:
        raise ValueError("cv must be >= 0 and target_pct > 0")
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    k = 2 * z**2 * (cv / (target_pct / 100.0)) ** 2 / (3 / math.pi)
    return max(2, math.ceil(k))


@dataclass(frozen=True)
class StepChange:
    """A step in a series: values from ``index`` on differ from those before it."""

    index: int
    change_pct: float
    p_value: float


OTAVA_MISSING = ("change points need Apache Otava's algorithm: pip install --no-deps 'apache-otava==0.8.0' "
                 "(numpy and scipy are all it needs; its other dependencies are integrations abwatch does not use)")


def change_points(values: Sequence[float], *, window: int = 30, max_pvalue: float = 0.001,
                  min_magnitude_pct: float = 0.0) -> list[StepChange]:
    """Step changes in a series (one value per commit), by Apache Otava's E-Divisive
    variant (Fleming et al., "Hunter"): windowed split, then merge of weak points."""
    try:
        from otava.analysis import compute_change_points  # heavy import, only when needed
    except ImportError:
        raise ImportError(OTAVA_MISSING) from None

    series = [float(x) for x in _as_samples(values, "series")]
    if len(series) < 4:
        return []
    found, _weak = compute_change_points(series, window_len=max(window, 4), max_pvalue=max_pvalue,
                                         min_magnitude=min_magnitude_pct / 100.0)
    return [StepChange(int(cp.index), float(cp.stats.forward_change_percent()), float(cp.stats.pvalue))
            for cp in found]
