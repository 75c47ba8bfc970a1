"""Pooled samples: judging two sets of timings that carry no process labels.

Imported records (another tool's results, schema v0.1 files) often hold only a flat list of
samples a side; :func:`service.stats.compare` sends them here. Pure functions over numpy
arrays of milliseconds; no database, no I/O. Measured choices: docs/statistics.md, "Pooled
samples".
"""

from __future__ import annotations

import math

import numpy as np

MAX_PAIRWISE = 4_000_000  # Hodges-Lehmann differences computed at most (thinned beyond)
POOLED_METHOD = ("pooled samples: shift of the 10th percentile of log times, order-statistic standard "
                 "errors widened by the design effect of consecutive samples; normal interval")
SMALL_POOLED_METHOD = "pooled samples: Hodges-Lehmann shift of log times, Moses interval; Mann-Whitney U"
QUANTILE = 0.10  # the percentile judged: below the ~25 % of clean samples of a machine at load 6-8
QUANTILE_MIN_SAMPLES = 40  # fewer, and the 10th percentile rests on 3 samples: Hodges-Lehmann instead
RUN = 5  # consecutive samples taken as one batch for the design effect (a process's samples, in order)
# Measured and rejected (docs/statistics.md): the shift of each side's fastest fifth, with a
# 5x allowance for samples that share processes, had 2-3x the power on the loaded machine's
# real trials, but 1.2-3 % false calls on independent samples with 3 % noise: truncating
# each side at its own order statistic makes the rank test overconfident. The percentile
# shift below keeps the power and gets its standard error from the order statistics.


def quantile_se(x: np.ndarray, q: float) -> float:
    """Standard error of the ``q``-quantile of ``x`` from an order-statistic spacing.

    sqrt(q (1-q) / n) / f(xi_q), with the density f estimated by the spacing of the order
    statistics n q ± 1.96 sqrt(n q (1-q)) (Siddiqui; Bloch & Gastwirth; the median's version
    is McKean & Schrader's, which Price & Bonett 2002 combine into an interval for a
    difference of medians). Distribution-free for independent samples; where the density is
    low at the quantile (between a fast and a slow mode) the spacing is wide and so is the
    error, instead of the rank test's overconfidence.
    """
    xs = np.sort(x)
    n = len(xs)
    spread = math.sqrt(n * q * (1.0 - q))
    low = max(0, int(math.floor(n * q - 1.96 * spread)))
    high = min(n - 1, int(math.ceil(n * q + 1.96 * spread)))
    return float((xs[high] - xs[low]) / ((high - low) / spread))


def design_effect(x: np.ndarray, q: float, run: int = RUN) -> float:
    """How much more the count of samples below the ``q``-quantile varies than if the
    samples were independent, from batches of ``run`` consecutive samples (record order).

    Pooled samples come from processes of a few samples each, and slow phases of the
    machine last several processes, so "fast" samples arrive in runs: the variance of the
    batches' fractions below the quantile over its binomial value q (1-q) / run, at least 1.
    In shuffled order it is ~1 and nothing is lost; in record order it widens the interval
    by the clustering the order reveals. Measured on 600 A/A trials of 60 samples a side:
    the 10th-percentile shift without it called 2.2 % on simulated machine phases and 2.5 %
    on processes with 50-90 % of samples pre-empted, with it 1.0 % and 0.7 %; the cost is
    on drift, which it also reads as clustering (docs/statistics.md).
    """
    k = len(x) // run
    if k < 4:
        return 1.0
    below = (x[: k * run] <= np.quantile(x, q)).reshape(k, run).mean(axis=1)
    return max(1.0, float(np.var(below, ddof=1)) / (q * (1.0 - q) / run))


def quantile_shift(a: np.ndarray, b: np.ndarray, confidence: float,
                   q: float = QUANTILE) -> tuple[float, tuple[float, float], float]:
    """Pooled samples: the shift of the ``q``-quantile of the log times (treatment minus
    control), a normal interval from each side's order-statistic standard error
    (:func:`quantile_se`) times its design effect (:func:`design_effect`), and the matching
    two-sided p-value.

    Why a low quantile: under this machine's usual load (6-8 on 2 cores) 70-76 % of 2-3 ms
    samples are pre-empted 2-5x, so every statistic of all samples (median, Hodges-Lehmann,
    Mann-Whitney) mostly measures the scheduler; the 10th percentile lies in the clean mode,
    the pooled analogue of judging a process by its fastest sample. Why this interval: the
    standard error of one quantile comes from the order statistics around it, so it is valid
    for independent samples whatever the shape (the rejected fastest-fifth rule truncated each
    side and then ran a rank test as if the rest were a full sample). Symmetric on the log
    scale by construction.
    """
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    la, lb = np.log(a), np.log(b)
    estimate = float(np.quantile(lb, q) - np.quantile(la, q))
    variance = sum(quantile_se(x, q) ** 2 * design_effect(x, q) for x in (la, lb))
    se = math.sqrt(variance)
    if se == 0.0:
        return pct(estimate), (pct(estimate), pct(estimate)), 1.0 if estimate == 0 else 0.0
    half = float(sps.norm.isf((1.0 - confidence) / 2.0)) * se
    p_value = float(2.0 * sps.norm.sf(abs(estimate) / se))
    return pct(estimate), (pct(estimate - half), pct(estimate + half)), p_value


def hodges_lehmann(a: np.ndarray, b: np.ndarray, confidence: float,
                    rng: np.random.Generator) -> tuple[float, tuple[float, float], float]:
    """Pooled samples: the Hodges-Lehmann shift of the log times (the median of all
    treatment-minus-control differences), Moses's distribution-free interval for it (the
    order statistics of those differences that Mann-Whitney's critical value picks), and
    Mann-Whitney's p-value. Far more efficient than a ratio of medians on the ~1 %-noisy,
    skewed samples of a busy machine, and as robust to pre-empted samples."""
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    la, lb = np.log(a), np.log(b)
    na, nb = len(la), len(lb)
    if na * nb > MAX_PAIRWISE:  # a huge import: thin both sides at random, same estimate
        keep = int(math.sqrt(MAX_PAIRWISE))
        la = rng.choice(la, min(na, keep), replace=False)
        lb = rng.choice(lb, min(nb, keep), replace=False)
    diffs = np.sort((lb[None, :] - la[:, None]).ravel())
    m, n = len(la), len(lb)
    z = sps.norm.ppf(1.0 - (1.0 - confidence) / 2.0)
    k = int(math.floor(m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0)))
    k = min(max(k, 0), len(diffs) // 2)
    low, high = float(diffs[k]), float(diffs[len(diffs) - 1 - k])
    p_value = float(sps.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    return pct(float(np.median(diffs))), (pct(low), pct(high)), p_value if not math.isnan(p_value) else 1.0


def pct(x: float) -> float:
    """A log ratio as a percent change."""
    return (math.exp(x) - 1.0) * 100.0
