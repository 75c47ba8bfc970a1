"""Statistics: is the treatment slower, faster, the same, or is it too early to say?

Pure functions over plain sequences of milliseconds; no database, no I/O.

Samples from one process are not independent: on a busy machine whole processes run a
few percent fast or slow, and slow phases last several processes. When the caller says
which process (invocation) each sample came from (``control_groups``/``treatment_groups``),
the process is the unit: the bootstrap resamples whole processes and Mann-Whitney compares
per-process medians. When the processes ran in interleaved pairs (``paired=True``, what
the runner does), each treatment process is compared with the control process that ran
next to it, which cancels the slow phases: each process counts by its fastest sample,
and the effect is the 10 %-trimmed mean of the pairs' log ratios and the interval is an *anytime-valid confidence sequence* around it
(:func:`cs_multiplier`), so the driver may look after every batch, as often as it likes,
without inflating the error rate; the p-value is the matching anytime-valid p-value.
Without groups (pooled samples, e.g. imported records) the effect is the shift of the 10th
percentile of the log times, with order-statistic standard errors widened by the clustering
that the samples' order reveals; under 40 samples a side, the Hodges-Lehmann shift with
Moses's interval and Mann-Whitney's p-value (both in :mod:`service.stats.pooled`).

:func:`~service.stats.sequential.sequential_look` is the one stopping rule: the driver and the ground-truth suite
both call it after each batch to get the verdict, whether to stop, why, and how many pairs
the next batch may have within the time budget and the optional invocation cap.

Decision rule, with ``t`` the threshold (the smallest change worth reporting):

* ``regression``  – the CI lies above 0, p < alpha, and the estimate is at least +t %;
* ``improvement`` – the mirror image;
* ``same``        – on the paired path, the interval at ``equivalence_alpha`` a side (two
  one-sided tests: the 90 % confidence sequence) lies within (-t %, +t %), elsewhere the
  whole CI: any change is smaller than t, with confidence (an equivalence statement, not
  merely "nothing found");
* ``unknown``     – anything else: not enough evidence either way.

A quantity that is better higher (``higher_is_better``: an LLM's tokens per second) is judged
the same way with the direction turned: each process counts by its highest sample, a pooled
side by its 90th percentile, and a drop of at least t % is the ``regression``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any
from collections.abc import Sequence

import numpy as np

from abwatch.service.stats import estimates, levels
from abwatch.service.stats.verdict import DEFAULT_EQUIVALENCE_ALPHA, Outcome, Verdict
from abwatch.service.stats.pooled import QUANTILE_MIN_SAMPLES, pct

DEFAULT_THRESHOLD_PCT = 1.0
DEFAULT_ALPHA = 0.01
DEFAULT_CONFIDENCE = 0.99
# `same` is an equivalence claim, decided as two one-sided tests (Schuirmann's TOST) at
# DEFAULT_EQUIVALENCE_ALPHA (service.stats.verdict) each, i.e. by the 1 - 2 x 0.05 = 90 %
# confidence sequence lying inside ±threshold.
DEFAULT_RESAMPLES = 2000
MIN_SAMPLES = 5


DEFAULT_PLAN_PAIRS = 30  # where the confidence sequence is tightest: a typical A/A stopping point
MIN_PAIRS = 8  # below this the spread of a few pairs is too uncertain to decide anything (measured)
TRIM = 0.1  # each side of the paired log ratios trimmed away (a whole pre-empted process)


def _mixture_rho2(alpha: float, plan: int) -> float:
    """The normal mixture's precision, tuned so the sequence is tightest at ``plan`` units
    (Howard et al. 2021, eq. (3.11))."""
    return (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / plan


def cs_multiplier(n: int, alpha: float, plan: int = DEFAULT_PLAN_PAIRS, min_pairs: int = MIN_PAIRS,
                  units: int | None = None) -> float:
    """Half-width of the two-sided anytime-valid confidence sequence at ``n`` units, in
    standard errors (sd / sqrt(n)).

    The normal-mixture boundary of the asymptotic confidence sequence (Waudby-Smith et al.
    2021, "Time-uniform central limit theory"): with probability 1 - alpha the interval
    estimate ± multiplier x se covers the truth at *every* n at once, so it may be looked
    at after every batch, any number of times, and the run may stop whenever it likes.
    At small n the standard deviation is itself uncertain: the multiplier is widened by
    Student's t over the normal quantile (df = n - 1), which the asymptotic result omits
    and which the ground-truth suite showed is needed below ~10 pairs; ``units`` (default
    ``n``) are the independent units that standard deviation was estimated from, fewer than
    ``n`` where pairs share a fork server (:mod:`service.stats.levels`). Under ``min_pairs``
    (default :data:`MIN_PAIRS`) the interval is unbounded.
    """
    if n < max(min_pairs, 2):
        return math.inf
    r2 = _mixture_rho2(alpha, plan)
    width = math.sqrt(2.0 * (n * r2 + 1.0) / (n * r2) * math.log(math.sqrt(n * r2 + 1.0) / alpha))
    return width * _small_sample(units or n, alpha)


@functools.lru_cache(maxsize=4096)
def _small_sample(n: int, alpha: float) -> float:
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    q = 1.0 - alpha / 2.0
    return float(sps.t.ppf(q, n - 1) / sps.norm.ppf(q))


def cs_p_value(z: float, n: int, alpha: float, plan: int = DEFAULT_PLAN_PAIRS, min_pairs: int = MIN_PAIRS,
               units: int | None = None) -> float:
    """Anytime-valid p-value of "no change" for an estimate ``z`` standard errors from 0.

    The smallest level at which the confidence sequence (tuned at ``alpha``, widened as in
    :func:`cs_multiplier`, with the same ``units``) excludes 0, so ``p < alpha`` exactly when
    the interval does.
    """
    if n < max(min_pairs, 2):
        return 1.0
    r2 = _mixture_rho2(alpha, plan)
    zz = z / _small_sample(units or n, alpha)
    return float(min(1.0, math.sqrt(n * r2 + 1.0) * math.exp(-zz * zz * n * r2 / (2.0 * (n * r2 + 1.0)))))


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
    rows: list[list[float]] = [[] for _ in order]
    for value, label in zip(samples, groups, strict=True):
        rows[order[label]].append(value)
    out = np.full((len(rows), max(map(len, rows))), np.nan)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


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
    plan_pairs: int = DEFAULT_PLAN_PAIRS,
    equivalence_alpha: float = DEFAULT_EQUIVALENCE_ALPHA,
    min_pairs: int = MIN_PAIRS,
    higher_is_better: bool = False,
    control_servers: Sequence | None = None,
    treatment_servers: Sequence | None = None,
) -> Verdict:
    """Judge ``treatment`` against ``control`` (both sequences of milliseconds, or of any
    positive quantity).

    ``*_groups`` optionally label each sample with the process it came from (see the
    module docstring); with them, at least ``min_samples`` samples and 3 processes a side
    are needed for a verdict. ``paired`` says the i-th control process ran next to the
    i-th treatment process (one interleaved pair), so their ratio cancels what the machine
    was doing at that moment; the interval is then a confidence sequence tightest near
    ``plan_pairs`` pairs, valid however often the caller looks (:func:`sequential_look`).
    On that paired path `same` is decided by the interval at ``equivalence_alpha`` a side
    (two one-sided tests); elsewhere by the reported interval. ``higher_is_better`` turns the
    direction (module docstring): the change is still the treatment's over the control's, and a
    drop is the regression. ``*_servers`` optionally label each sample, beside its process, with
    the fork server that process was a child of (None: a fresh process); pairs that share
    servers are then judged with the server as a level (:mod:`service.stats.levels`).
    """
    _check_levels(threshold_pct, alpha, confidence, equivalence_alpha)
    a, b = _as_samples(control, "control"), _as_samples(treatment, "treatment")
    params = dict(threshold_pct=threshold_pct, alpha=alpha, confidence=confidence)
    base: dict[str, Any] = dict(control_n=len(a), treatment_n=len(b), equivalence_alpha=equivalence_alpha,
                                higher_is_better=higher_is_better, **params)
    ca, cb = _clusters(a, control_groups, "control"), _clusters(b, treatment_groups, "treatment")
    min_clusters = 3 if control_groups is not None or treatment_groups is not None else min_samples
    if len(a) < min_samples or len(b) < min_samples or min(len(ca), len(cb)) < min_clusters:
        return _too_few(a, b, ca, cb, min_samples, min_clusters, base)
    med_a, med_b = float(np.median(a)), float(np.median(b))
    base.update(control_median_ms=med_a, treatment_median_ms=med_b)
    if med_a <= 0:
        return Verdict(Outcome.UNKNOWN, None, None, None,
                       reason="control median is 0 ms; a relative change is undefined", **base)

    # the path follows the samples' shape; the order of the tests is the order of preference
    identical = bool(np.ptp(a) == 0 and np.ptp(b) == 0)
    if not identical and paired and control_groups is not None and treatment_groups is not None and _positive(ca, cb):
        blocks = _blocks(control_servers, treatment_servers, control_groups, treatment_groups)
        return _paired_verdict(ca, cb, base, confidence, plan_pairs, equivalence_alpha, min_pairs, higher_is_better,
                               blocks)
    found = _estimate(a, b, ca, cb, identical, confidence, resamples, seed, higher_is_better)
    judged = _decide(found.change, found.ci, found.p_value, base)
    return _figures(replace(judged, method=found.method), med_a, MEDIAN_ESTIMATOR)


def _estimate(a: np.ndarray, b: np.ndarray, ca: np.ndarray, cb: np.ndarray, identical: bool, confidence: float,
              resamples: int, seed: int, higher_is_better: bool) -> estimates.Estimate:
    """The change's estimate on the path the samples' shape calls for (the pairs' path aside):
    none to make between identical samples; on the log scale over single samples a unit, by
    quantiles or, with few, a small pooled test; a bootstrap of the samples where zeros forbid
    the log scale; else a bootstrap of the processes."""
    med_a, med_b = float(np.median(a)), float(np.median(b))
    change = (med_b / med_a - 1.0) * 100.0
    pooled = ca.shape[1] == 1 and cb.shape[1] == 1  # one sample per unit
    if identical:
        return estimates.identical(change, med_a, med_b)
    if pooled and bool((a > 0).all() and (b > 0).all()):
        return (estimates.quantile(a, b, confidence, higher_is_better)
                if min(len(a), len(b)) >= QUANTILE_MIN_SAMPLES else estimates.small_pooled(a, b, confidence, seed))
    if pooled:  # zeros among the samples: no log scale
        return estimates.sample_bootstrap(a, b, change, resamples, confidence, seed)
    return estimates.process_bootstrap(ca, cb, change, resamples, confidence, seed)


def _check_levels(threshold_pct: float, alpha: float, confidence: float, equivalence_alpha: float) -> None:
    """Refuse a threshold or a level no comparison can be judged at."""
    if threshold_pct <= 0:
        raise ValueError("threshold_pct must be > 0")
    if not 0 < alpha < 1 or not 0 < confidence < 1 or not 0 < equivalence_alpha < 0.5:
        raise ValueError("alpha and confidence must lie in (0, 1), equivalence_alpha in (0, 0.5)")


def _too_few(a: np.ndarray, b: np.ndarray, ca: np.ndarray, cb: np.ndarray, min_samples: int, min_clusters: int,
             base: dict[str, Any]) -> Verdict:
    """The `unknown` of a comparison with too few samples or processes to judge, saying how many."""
    return Verdict(
        Outcome.UNKNOWN, None, None, None,
        control_median_ms=float(np.median(a)) if len(a) else None,
        treatment_median_ms=float(np.median(b)) if len(b) else None,
        reason=(f"too few samples (need {min_samples} a side in {min_clusters} processes, have "
                f"{len(a)} in {len(ca)} and {len(b)} in {len(cb)})"),
        **base,
    )


def _blocks(control_servers: Sequence | None, treatment_servers: Sequence | None, control_groups: Sequence,
            treatment_groups: Sequence) -> list | None:
    """Each pair's block, (its control process's server, its treatment process's server), in
    the pairs' order; a fresh process (server None) is a server of its own. None without labels."""
    if control_servers is None or treatment_servers is None:
        return None
    sides = []
    for name, servers, groups in (("control", control_servers, control_groups),
                                  ("treatment", treatment_servers, treatment_groups)):
        servers, groups = list(servers), list(groups)
        if len(servers) != len(groups):
            raise ValueError(f"{name}_servers: {len(servers)} labels for {len(groups)} samples")
        first: dict = {}
        for group, server in zip(groups, servers, strict=True):  # the clusters' order (_clusters)
            first.setdefault(group, ("process", group) if server is None else server)
        sides.append(list(first.values()))
    return list(zip(*sides, strict=False))


def _paired_verdict(ca: np.ndarray, cb: np.ndarray, base: dict[str, Any], confidence: float, plan_pairs: int,
                    equivalence_alpha: float, min_pairs: int, higher_is_better: bool,
                    blocks: list | None = None) -> Verdict:
    """The paired path: interleaved processes judged by their pairs' log ratios (:func:`_paired`),
    `same` decided by the equivalence interval; no interval (`unknown`) under ``min_pairs`` pairs,
    nor from fewer than :data:`levels.MIN_BLOCKS` server pairs where pairs share fork servers."""
    change, ci, p_value, same_ci, level = _paired(ca, cb, confidence, plan_pairs, 2.0 * equivalence_alpha,
                                                  min_pairs, higher_is_better, blocks)
    best = float(np.median(_best(ca, higher_is_better)))
    estimator = HIGHEST_ESTIMATOR if higher_is_better else FASTEST_ESTIMATOR
    method = PAIRED_METHOD if level is None else f"{PAIRED_METHOD}; {level.describe()}"
    if not all(math.isfinite(x) for x in ci):  # under MIN_PAIRS (or MIN_BLOCKS) no interval
        pairs = min(len(ca), len(cb))
        few = (f"too few pairs for an interval ({pairs}; {min_pairs} are needed)" if level is None or pairs < min_pairs
               else f"too few fork-server pairs for an interval ({pairs} pairs; {level.shared} server pairs served "
                    f"two or more, {levels.MIN_BLOCKS} are needed to tell a server's memory layout from a change)")
        return _figures(Verdict(Outcome.UNKNOWN, change, None, None, method=method, reason=few,
                                design_effect=None if level is None else level.design_effect, **base),
                        best, estimator)
    judged = replace(_decide(change, ci, p_value, base, same_ci=same_ci), method=method)
    if level is not None:  # said where the verdict is read (report, run page), not only in the method
        judged = replace(judged, reason=f"{judged.reason}; {level.describe()}", design_effect=level.design_effect)
    return _figures(judged, best, estimator)


FASTEST_ESTIMATOR = ("fastest sample per process, median across the control's processes; "
                     "treatment = control x (1 + judged change)")
HIGHEST_ESTIMATOR = ("highest sample per process, median across the control's processes; "
                     "treatment = control x (1 + judged change)")
MEDIAN_ESTIMATOR = "median of the control's samples; treatment = control x (1 + judged change)"


def _figures(verdict: Verdict, control_ms: float, estimator: str) -> Verdict:
    """``verdict`` with the figures it was judged on (see :class:`Verdict`)."""
    treatment = None if verdict.change_pct is None else control_ms * (1 + verdict.change_pct / 100)
    return replace(verdict, control_ms=control_ms, treatment_ms=treatment, estimator=estimator)


def _fastest(clusters: np.ndarray) -> np.ndarray:
    """Each process's fastest sample: what a paired process is judged by (see :func:`_paired`)."""
    return np.nanmin(clusters, axis=1)


def _best(clusters: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Each process's best sample: its fastest, or its highest where higher is better (the
    sample other processes' time slices took the least from, either way)."""
    return np.nanmax(clusters, axis=1) if higher_is_better else _fastest(clusters)


def _positive(ca: np.ndarray, cb: np.ndarray) -> bool:
    return bool((_fastest(ca) > 0).all() and (_fastest(cb) > 0).all())


PAIRED_METHOD = ("paired process medians: trimmed mean of log ratios, "
                 "anytime-valid confidence sequence and p-value")
def _paired(ca: np.ndarray, cb: np.ndarray, confidence: float, plan: int, same_alpha: float,
            min_pairs: int = MIN_PAIRS, higher_is_better: bool = False, blocks: list | None = None
            ) -> tuple[float, tuple[float, float], float, tuple[float, float], levels.ServerLevel | None]:
    """Change, confidence sequence, anytime p-value, the equivalence interval (at
    ``same_alpha``, for `same`) and the server level (None: no pairs share fork servers) from
    the paired processes' log ratios, one estimate for all.

    Each process is represented by its fastest sample: on a shared 2-core machine at load
    4-8, most 2 ms samples are pre-empted (2-5x slower), so a process's median is itself a
    pre-empted sample, while one clean sample in five is enough for its minimum (Chen &
    Revels 2016, "Robust benchmarking in noisy environments", argue the same for CPU-bound
    code). On 300 real trials under that load the minimum's pairs spread 2.4x less than the
    medians', which took +2 % from 0 % to 76 % detected (docs/statistics.md).

    The estimate is the 10 %-trimmed mean of the log ratios (a whole process pre-empted on
    one side of a pair is trimmed away); its standard error is the winsorized one (Yuen),
    and the interval is symmetric on the log scale by construction: the percentile
    bootstrap this replaces, at the extreme levels a multi-look correction asks for, picked
    its bound from the few resamples that drew an outlier pair three or four times — the
    +10 % change whose interval reached +48.7 %.

    Where higher is better, each process is represented by its highest sample instead. Where
    ``blocks`` say the pairs share fork servers, the standard error grows by the design effect
    and the small-sample widening counts blocks (:mod:`service.stats.levels`).
    """
    k = min(len(ca), len(cb))
    d = np.log(_best(cb[:k], higher_is_better) / _best(ca[:k], higher_is_better))
    estimate, se = trimmed_mean_se(d)
    level = None if blocks is None else levels.server_level(winsorize(d), blocks[:k])
    alpha = 1.0 - confidence
    if level is not None and level.shared < levels.MIN_BLOCKS:
        unbounded = (-math.inf, math.inf)
        return pct(estimate), unbounded, 1.0, unbounded, level
    if se == 0.0:
        point = (pct(estimate), pct(estimate))
        return pct(estimate), point, 1.0 if estimate == 0 else 0.0, point, level
    units = None
    if level is not None:
        se, units = se * math.sqrt(level.design_effect), level.units
    half = cs_multiplier(k, alpha, plan, min_pairs, units) * se
    same_half = cs_multiplier(k, same_alpha, plan, min_pairs, units) * se  # the equivalence interval (TOST)
    p_value = cs_p_value(estimate / se, k, alpha, plan, min_pairs, units)
    return (pct(estimate), (pct(estimate - half), pct(estimate + half)), p_value,
            (pct(estimate - same_half), pct(estimate + same_half)), level)


def winsorize(d: np.ndarray, trim: float = TRIM) -> np.ndarray:
    """``d`` with its ``trim`` share at each end set to the nearest value kept, in ``d``'s order."""
    n = len(d)
    g = int(trim * n)
    ordered = np.sort(d)
    return np.clip(d, ordered[g], ordered[n - 1 - g])


def trimmed_mean_se(d: np.ndarray, trim: float = TRIM) -> tuple[float, float]:
    """The trimmed mean of ``d`` and its standard error from the winsorized variance."""
    n = len(d)
    g = int(trim * n)
    estimate = float(np.mean(np.sort(d)[g:n - g]))
    sd = float(np.std(winsorize(d, trim), ddof=1)) if n > 1 else 0.0
    return estimate, sd / ((1.0 - 2.0 * g / n) * math.sqrt(n))


def _decide(change: float, ci: tuple[float, float], p_value: float, base: dict,
            p_decide: float | None = None, same_ci: tuple[float, float] | None = None) -> Verdict:
    """Apply the decision rule; ``p_decide`` (an adjusted p-value) replaces ``p_value`` if given;
    ``same_ci`` (the equivalence interval), if given, decides `same` instead of ``ci``."""
    t, alpha = base["threshold_pct"], base["alpha"]
    p = p_value if p_decide is None else p_decide
    low, high = ci
    same_low, same_high = same_ci or ci
    # a rise is the regression, unless higher is better: then a drop is
    higher = bool(base.get("higher_is_better"))
    rise, drop = (Outcome.IMPROVEMENT, Outcome.REGRESSION) if higher else (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    up, down = ("higher", "lower") if higher else ("slower", "faster")
    if low > 0 and p < alpha and change >= t:
        outcome, reason = rise, f"{up} by {change:.2f}% (CI above 0, p={p:.2g})"
    elif high < 0 and p < alpha and change <= -t:
        outcome, reason = drop, f"{down} by {-change:.2f}% (CI below 0, p={p:.2g})"
    elif -t < same_low and same_high < t:
        level = f"{100 * (1 - 2 * base['equivalence_alpha']):g}% CI" if same_ci else "CI"
        outcome, reason = Outcome.SAME, f"any change is within ±{t:g}% ({level} {same_low:.2f}..{same_high:.2f}%)"
    else:
        outcome, reason = Outcome.UNKNOWN, f"inconclusive (CI {low:.2f}..{high:.2f}%, p={p:.2g})"
    return Verdict(outcome, change, (low, high), p_value, reason=reason, same_ci_pct=same_ci, **base)


def adjust_fdr(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Control the false discovery rate across one run's comparisons (Benjamini-Hochberg).

    Every verdict that has a p-value is decided again with its BH-adjusted p-value, so a
    run of many workloads does not flag more of them by chance than one workload would.
    Verdicts without a p-value (too few samples, failures) pass through unchanged.
    """
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    tested = [i for i, v in enumerate(verdicts) if v.p_value is not None]
    out = list(verdicts)
    if not tested:
        return out
    adjusted = sps.false_discovery_control([verdicts[i].p_value for i in tested], method="bh")
    for i, p_adj in zip(tested, adjusted, strict=True):
        v = verdicts[i]
        assert v.change_pct is not None and v.ci_pct is not None and v.p_value is not None  # tested: it has a p
        base: dict[str, Any] = dict(control_n=v.control_n, treatment_n=v.treatment_n,
                    control_median_ms=v.control_median_ms, treatment_median_ms=v.treatment_median_ms,
                    threshold_pct=v.threshold_pct, alpha=v.alpha, confidence=v.confidence,
                    equivalence_alpha=v.equivalence_alpha, higher_is_better=v.higher_is_better)
        decided = _decide(v.change_pct, v.ci_pct, v.p_value, base, p_decide=float(p_adj), same_ci=v.same_ci_pct)
        # the reason names the p that decided, so it is not mistaken for the raw one
        stop = v.stop_reason
        if stop and decided.verdict != v.verdict:  # the look decided; the run's correction did not agree
            stop += f" ({v.verdict.value} before Benjamini-Hochberg)"
        # the server level, where one was taken, stays said (the method's part after the paired one)
        said = v.method.rpartition("; ")[2]
        level = f"; {said}" if v.design_effect is not None and said.startswith("fork servers") else ""
        out[i] = replace(decided, p_adjusted=float(p_adj), correction="benjamini-hochberg",
                         stop_reason=stop, method=v.method, looks=v.looks, elapsed_s=v.elapsed_s,
                         reason=(f"{v.caveat}; " if v.caveat else "") + decided.reason.replace("p=", "BH-adjusted p=")
                         + level, control_ms=v.control_ms, treatment_ms=v.treatment_ms, estimator=v.estimator,
                         unit=v.unit, caveat=v.caveat, design_effect=v.design_effect)
    return out


def process_cv(samples: Sequence[float], groups: Sequence) -> float:
    """Coefficient of variation of each process's fastest sample: the noise the paired
    verdict works against."""
    clusters = _clusters(_as_samples(samples, "samples"), groups, "samples")
    medians = _fastest(clusters)
    if len(medians) < 2 or np.mean(medians) <= 0:
        raise ValueError("process_cv needs at least 2 processes with a positive mean")
    return float(np.std(medians, ddof=1) / np.mean(medians))


def planned_repetitions(cv: float, target_pct: float, alpha: float, power: float = 0.95,
                        plan: int = DEFAULT_PLAN_PAIRS) -> int:
    """Pairs of processes needed to detect a ``target_pct`` change with ``power``.

    ``cv`` is the spread of per-process medians; a pair's log ratio spreads by about
    sqrt(2) cv. The smallest n where the confidence sequence's half-width plus the power
    margin fits inside the target: sqrt(2) cv (m(n) + z_power) / sqrt(n) <= target.
    """
    from scipy import stats as sps  # when used: a second of start-up to processes that judge nothing
    if cv < 0 or target_pct <= 0:
        raise ValueError("cv must be >= 0 and target_pct > 0")
    sd, target, z_power = math.sqrt(2.0) * cv, target_pct / 100.0, sps.norm.ppf(power)
    n = MIN_PAIRS  # nothing is decided with fewer
    while n < 100_000 and sd * (cs_multiplier(n, alpha, plan) + z_power) / math.sqrt(n) > target:
        n += 1 if n < 64 else n // 16
    return n


def fastest_median(samples: Sequence[float], groups: Sequence) -> float | None:
    """Each process's fastest sample, then their median: one side's figure on the scale the
    paired verdict judges (the trend series plots it, so a step reads as the verdicts saw it)."""
    fastest: dict = {}
    for value, group in zip(samples, groups, strict=True):
        fastest[group] = min(value, fastest.get(group, math.inf))
    return float(np.median(list(fastest.values()))) if fastest else None
