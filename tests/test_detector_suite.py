"""The ground-truth suite's rules behave as their sources define them (small, fast checks)."""

from __future__ import annotations

import numpy as np

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
