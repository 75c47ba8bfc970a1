"""Decision rules judged side by side on the same data.

abwatch's rule is ``service.stats.sequential_look`` called exactly as the driver calls it:
paired interleaved processes, judged after every batch by an anytime-valid confidence
sequence until decided, out of pairs or out of time. The anchors are the published rules of
other systems, applied as they apply them, to pooled samples.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq

from abwatch.service import stats
from abwatch.service.stats import pooled


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


# --- Group-sequential alpha spending (Lan-DeMets, O'Brien-Fleming type), for comparison ---

def obf_spent(t: float, alpha: float, extend: bool = False) -> float:
    """Alpha spent by information fraction ``t``: Lan & DeMets' O'Brien-Fleming-type function
    2 - 2 Phi(z_{1-alpha/2} / sqrt(t)); all of alpha at t >= 1, nothing left past it, unless
    ``extend`` carries the function on past the horizon (spending more than alpha: the
    naive way to keep deciding when a run outlives its planned information)."""
    if t <= 0:
        return 0.0
    return float(2.0 * sps.norm.sf(sps.norm.isf(alpha / 2.0) / math.sqrt(t if extend else min(t, 1.0))))


GRID = 401  # points of the continuation region the recursion integrates over


@functools.lru_cache(maxsize=4096)
def _ld_state(info: tuple[float, ...], alpha: float, extend: bool = False) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(last boundary, alpha spent, grid, sub-density of the score at the last look) after
    looks at information ``info`` (fractions of the horizon; past 1 allowed: the information
    is what it is, only the spending stops). Armitage-McPherson-Rowe recursion on the score
    S = Z sqrt(t), a Brownian motion in t; each prefix is cached, so a new look costs one step."""
    t = info[-1]
    target_total = obf_spent(t, alpha, extend)
    if len(info) == 1:
        spent_before, xs, dens, dt = 0.0, None, None, t
    else:
        _, spent_before, xs, dens = _ld_state(info[:-1], alpha, extend)
        dt = t - info[-2]
    target = target_total - spent_before
    sd = math.sqrt(dt)
    root_t = math.sqrt(t)

    def exit_prob(c: float) -> float:
        if xs is None:
            return float(2.0 * sps.norm.sf(c))
        b = c * root_t
        return float(np.sum(dens * (sps.norm.sf((b - xs) / sd) + sps.norm.sf((b + xs) / sd))))

    if target <= 1e-15 or dt <= 0:
        c, spent = math.inf, spent_before
    elif exit_prob(1e-6) <= target:
        c, spent = 0.0, target_total
    else:
        c = float(brentq(lambda x: exit_prob(x) - target, 1e-6, 60.0, xtol=1e-10))
        spent = target_total
    half = min(c, 9.0) * root_t  # beyond ~9 sd the continuation density is nil
    ys = np.linspace(-half, half, GRID)
    w = np.full(GRID, ys[1] - ys[0])  # trapezoid weights, folded into the sub-density below
    w[0] = w[-1] = w[0] / 2.0
    if xs is None:
        new = sps.norm.pdf(ys / sd) / sd
    else:
        new = (dens[None, :] * sps.norm.pdf((ys[:, None] - xs[None, :]) / sd) / sd).sum(axis=1)
    return c, spent, ys, new * w


def obf_boundary(info: Sequence[float], alpha: float, extend: bool = False) -> float:
    """Two-sided boundary for Z at the last of the looks at information fractions ``info``
    (increasing), with the OBF-type spending of :func:`obf_spent` (inf: no alpha left)."""
    return _ld_state(tuple(round(float(t), 9) for t in info), alpha, extend)[0]


def lan_demets(trial: Trial, budget: Budget, threshold_pct: float = 1.0, alpha: float = 0.01,
               horizon: int | None = None, past_horizon: str = "stop",
               equivalence_alpha: float = stats.DEFAULT_EQUIVALENCE_ALPHA) -> Decision:
    """Group-sequential rule on the same paired statistic and the same looks as :func:`abwatch`:
    the 10 %-trimmed mean of the pairs' log ratios and its Yuen standard error, judged by
    repeated confidence intervals estimate ± c_k se whose boundaries c_k spend alpha by the
    O'Brien-Fleming-type function of the information fraction n / ``horizon`` pairs (widened
    by the same Student-t factor as abwatch's sequence; nothing decided under 8 pairs).
    `same`, as in ``stats.compare``, is two one-sided tests at ``equivalence_alpha`` a side:
    the repeated interval of a spending rule for 2 x ``equivalence_alpha`` lies inside
    ±threshold.

    ``horizon`` (pairs) defaults to what the time budget buys at the first look's pace;
    without a time budget, to the pair cap. Decisions as in ``stats.compare``:
    regression/improvement when the interval excludes 0 and the estimate is beyond the
    threshold, same when it lies within ±threshold. Past the horizon no alpha is left:
    ``past_horizon="stop"`` stops at the first look that reaches it (time may remain);
    ``"extend"`` keeps looking and carries the spending function on past t = 1, spending
    more than alpha (what naive continuation does; measured in docs/statistics.md).
    """
    cap = min(budget.most, len(trial.control))
    k, look, info = min(budget.start, cap), 0, []
    base = dict(threshold_pct=threshold_pct, alpha=alpha, confidence=1.0 - alpha, control_n=0, treatment_n=0,
                control_median_ms=None, treatment_median_ms=None)
    while True:
        look += 1
        elapsed = sum(trial.pair_s[:k]) if trial.pair_s else k * budget.pace_s
        if horizon is None:
            pace = elapsed / k
            horizon = cap if pace <= 0 or math.isinf(budget.max_seconds) else max(1, int(budget.max_seconds // pace))
        verdict = "unknown"
        estimate, ci = None, None
        if k >= stats.MIN_PAIRS:
            info.append(k / horizon)
            d = np.log(np.array([min(p) for p in trial.treatment[:k]]) / np.array([min(p) for p in trial.control[:k]]))
            est, se = stats.trimmed_mean_se(d)
            extend, eq = past_horizon == "extend", 2.0 * equivalence_alpha
            c = obf_boundary(info, alpha, extend) * stats._small_sample(k, alpha)
            c_same = obf_boundary(info, eq, extend) * stats._small_sample(k, eq)
            low, high = (est - c * se, est + c * se) if se > 0 else (est, est)
            s_low, s_high = (est - c_same * se, est + c_same * se) if se > 0 else (est, est)
            same = (pooled.pct(s_low), pooled.pct(s_high))
            crossed = low > 0 or high < 0
            v = stats._decide(pooled.pct(est), (pooled.pct(low), pooled.pct(high)), 0.0 if crossed else 1.0,
                              dict(base, equivalence_alpha=equivalence_alpha), same_ci=same)
            verdict, estimate, ci = v.verdict.value, v.change_pct, v.ci_pct
        pace = elapsed / k
        room = min(budget.step, cap - k)
        affordable = room if pace <= 0 else int((budget.max_seconds - elapsed) // pace)
        if verdict != "unknown" or room <= 0 or affordable < 1 or (k >= horizon and past_horizon == "stop"):
            call = {"regression": 1, "improvement": -1}.get(verdict, 0)
            return Decision(call, sum(len(p) for p in trial.control[:k]), verdict, estimate, ci, look, elapsed)
        k += min(room, affordable)


def hodges_lehmann(trial: Trial, k: int, confidence: float = 0.99, alpha: float = 0.01,
                   threshold_pct: float = 1.0) -> Decision:
    """The previous pooled path, kept for comparison: the Hodges-Lehmann shift of all log
    times with Moses's interval and Mann-Whitney's p-value, decided as ``stats.compare`` does."""
    a, b = _pooled(trial, k)
    change, ci, p = pooled.hodges_lehmann(a, b, confidence, np.random.default_rng(0))
    base = dict(threshold_pct=threshold_pct, alpha=alpha, confidence=confidence, control_n=len(a),
                treatment_n=len(b), control_median_ms=None, treatment_median_ms=None)
    v = stats._decide(change, ci, p, base)
    return _decision(v, len(a), 1, 0.0)
