"""A deterministic quantity judged from one value a side: no repetitions, no interval to estimate.

The size of a compiled library, of a build's binary: the same inputs give the same bytes, so
one value per side is the measurement, and the change is exact. A change beyond the threshold
(either way) is a regression or an improvement; within it, the same. Pure, as the rest of
:mod:`service.stats`.
"""

from __future__ import annotations

from typing import Any

from abwatch.service.stats.verdict import Outcome, Verdict

METHOD = "exact: one deterministic value a side"


def compare_exact(control: float, treatment: float, *, threshold_pct: float, unit: str) -> Verdict:
    """The verdict of ``treatment`` against ``control``, two deterministic values (larger is
    worse): ``change_pct`` exact and its interval that one point."""
    if threshold_pct <= 0:
        raise ValueError("threshold_pct must be > 0")
    base: dict[str, Any] = dict(control_n=1, treatment_n=1, control_median_ms=control, treatment_median_ms=treatment,
                threshold_pct=threshold_pct, alpha=0.0, confidence=1.0, method=METHOD, unit=unit,
                control_ms=control, treatment_ms=treatment, estimator="the one value of each side")
    if control <= 0:
        return Verdict(Outcome.UNKNOWN, None, None, None, reason=f"control is {control:g} {unit}; a relative "
                       "change is undefined", **base)
    change = (treatment / control - 1.0) * 100.0
    if change > threshold_pct:
        outcome, reason = Outcome.REGRESSION, f"larger by {change:.2f}% ({control:,.0f} -> {treatment:,.0f} {unit})"
    elif change < -threshold_pct:
        outcome, reason = Outcome.IMPROVEMENT, f"smaller by {-change:.2f}% ({control:,.0f} -> {treatment:,.0f} {unit})"
    else:
        outcome, reason = Outcome.SAME, f"within ±{threshold_pct:g}% ({change:+.2f}%, {control:,.0f} -> {treatment:,.0f} {unit})"
    return Verdict(outcome, change, (change, change), None, reason=reason, **base)
