"""The ground-truth suite's rules behave as their sources define them (small, fast checks)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from benchmarks.detector import rules, simulate
from benchmarks.detector.rules import Budget, Trial


def _trial(change: float, k: int = 12, m: int = 5, cv: float = 0.01, seed: int = 0) -> Trial:
    rng = np.random.default_rng(seed)
    return Trial([list(10 * rng.lognormal(0, cv, m)) for _ in range(k)],
                 [list(10 * (1 + change) * rng.lognormal(0, cv, m)) for _ in range(k)])


def test_asv_needs_its_ten_percent_factor():
    assert rules.asv(_trial(0.05), 12).call == 0  # significant, but under asv's 1.1 factor
    assert rules.asv(_trial(0.15), 12).call == 1
    assert rules.asv(_trial(-0.15), 12).call == -1


def test_lnt_ignores_changes_under_one_percent():
    assert rules.lnt(_trial(0.005, cv=0.001), 12).call == 0
    assert rules.lnt(_trial(0.03), 12).call == 1


def test_welch_and_pinpoint_flag_a_clear_change():
    assert rules.welch(_trial(0.05), 12).call == 1
    assert rules.pinpoint(_trial(0.05), 12).call == 1
    assert rules.pinpoint(_trial(0.0, seed=3), 12).samples == 60


def test_abwatch_rule_looks_again_only_while_unknown():
    budget = Budget(start=12, step=6, most=36)
    clear = rules.abwatch(_trial(0.10, k=36), budget)
    assert clear.call == 1 and clear.samples == 12 * 5
    hopeless = rules.abwatch(_trial(0.0, k=36, cv=0.3), budget)
    assert hopeless.call == 0 and hopeless.samples == 36 * 5


def test_wilson_interval():
    lo, hi = rules.wilson(0, 300)
    assert lo == 0.0 and 0.012 < hi < 0.013
    assert rules.wilson(5, 10)[0] < 0.5 < rules.wilson(5, 10)[1]


def test_simulated_layouts():
    rng = np.random.default_rng(1)
    t = simulate.trial(rng, "drift", 0.0, 10, layout="blocks")
    assert len(t.control) == len(t.treatment) == 10
    # drift makes later (treatment) blocks slower; interleaving spreads it over both sides
    assert np.median(np.concatenate(t.treatment)) > np.median(np.concatenate(t.control))


def test_obf_spending_and_boundaries():
    # one look at the horizon spends all of alpha: the fixed-sample two-sided quantile
    assert rules.obf_boundary([1.0], 0.01) == pytest.approx(2.5758, abs=1e-3)
    # a first look spends alpha(t) alone: the boundary is the normal quantile of what it spent
    assert rules.obf_boundary([0.2], 0.05) == pytest.approx(sps.norm.isf(rules.obf_spent(0.2, 0.05) / 2), abs=1e-6)
    five = [rules.obf_boundary([(j + 1) / 5 for j in range(k)], 0.05) for k in range(1, 6)]
    assert five == sorted(five, reverse=True) and 2.0 < five[-1] < 2.1  # O'Brien-Fleming shape
    # nothing left past the horizon, unless the spending is carried past it
    assert rules.obf_boundary([0.5, 1.0, 1.5], 0.01) == float("inf")
    assert rules.obf_boundary([0.5, 1.0, 1.5], 0.01, extend=True) < 4.0


def test_obf_boundaries_hold_alpha_on_brownian_motion():
    rng = np.random.default_rng(2)
    info = np.array([12, 18, 24, 30, 36]) / 36
    bounds = np.array([rules.obf_boundary(info[:k + 1], 0.05) for k in range(len(info))])
    steps = rng.normal(size=(40_000, len(info))) * np.sqrt(np.diff(info, prepend=0.0))
    z = np.cumsum(steps, axis=1) / np.sqrt(info)
    assert 0.045 < (np.abs(z) >= bounds).any(axis=1).mean() < 0.055


def test_lan_demets_rule_decides_a_clear_change_and_stops_at_its_horizon():
    budget = Budget(start=12, step=6, most=36)
    clear = rules.lan_demets(_trial(0.10, k=36), budget)
    assert clear.call == 1 and clear.verdict == "regression"
    quiet = rules.lan_demets(_trial(0.0, k=36, cv=0.002), budget)
    assert quiet.verdict == "same" and quiet.samples == 12 * 5
    hopeless = rules.lan_demets(_trial(0.0, k=60, cv=0.3), Budget(start=12, step=6, most=60), horizon=24)
    assert hopeless.call == 0 and hopeless.samples == 24 * 5  # no alpha left past 24 pairs
    carried = rules.lan_demets(_trial(0.0, k=60, cv=0.3), Budget(start=12, step=6, most=60), horizon=24,
                               past_horizon="extend")
    assert carried.samples > 24 * 5


def test_sequential_comparison_smoke():
    """Both sequential rules on a few simulated trials through the suite's own table code."""
    from benchmarks.detector.__main__ import CS, LD, judge, sequential_table

    rng = np.random.default_rng(3)
    by_effect = {e: judge([simulate.trial(rng, "lognormal", e / 100, 36) for _ in range(4)], 1)
                 for e in (0.0, 10.0)}
    assert all(d.call == 1 for d in by_effect[10.0][LD] + by_effect[10.0][CS])
    text = sequential_table({"lognormal": by_effect})
    assert "Lan-DeMets" in text and "+10%" in text


def test_pooled_windows_cut_long_trials_into_windows():
    from benchmarks.detector.__main__ import POOLED, pooled_windows_table

    rng = np.random.default_rng(4)
    by_tag = {"same": [simulate.trial(rng, "lognormal", 0.0, 36)], "plus10": [simulate.trial(rng, "lognormal", 0.1, 24)]}
    text = pooled_windows_table(by_tag, 12)
    assert "Windows: A/A 3, +10% 2." in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {POOLED}"))
    assert row.rstrip(" |").endswith("100.0% [34.2, 100.0]")  # both +10 % windows called
