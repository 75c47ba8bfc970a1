"""service.stats.compare: known distributions, edge cases, and the A/A false-positive bound."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from abwatch.service.stats import Outcome, compare


def noisy(rng, n, median, cv=0.01):
    return median * rng.lognormal(0.0, cv, n)


def test_detects_a_two_percent_slowdown_with_one_percent_noise():
    rng = np.random.default_rng(0)
    v = compare(noisy(rng, 60, 10.0), noisy(rng, 60, 10.2))
    assert v.verdict == Outcome.REGRESSION
    assert 1.3 < v.change_pct < 2.7
    assert v.ci_pct[0] > 0 and v.p_value < 0.01
    assert (v.control_n, v.treatment_n) == (60, 60)


def test_improvement_is_the_mirror_image():
    rng = np.random.default_rng(1)
    v = compare(noisy(rng, 60, 10.0), noisy(rng, 60, 9.0))
    assert v.verdict == Outcome.IMPROVEMENT and v.ci_pct[1] < 0
    assert -11.5 < v.change_pct < -8.5


def test_same_means_the_whole_interval_is_inside_the_threshold():
    rng = np.random.default_rng(2)
    v = compare(noisy(rng, 80, 10.0, 0.005), noisy(rng, 80, 10.0, 0.005))
    assert v.verdict == Outcome.SAME
    assert -1.0 < v.ci_pct[0] <= v.change_pct <= v.ci_pct[1] < 1.0


def test_a_real_but_tiny_change_is_same_not_regression():
    rng = np.random.default_rng(3)
    v = compare(noisy(rng, 200, 10.0, 0.002), noisy(rng, 200, 10.03, 0.002))  # +0.3 %
    assert v.verdict == Outcome.SAME


def test_too_noisy_to_tell_is_unknown():
    rng = np.random.default_rng(4)
    v = compare(noisy(rng, 8, 10.0, 0.2), noisy(rng, 8, 10.3, 0.2))
    assert v.verdict == Outcome.UNKNOWN
    assert "inconclusive" in v.reason


def test_preempted_outliers_do_not_move_the_median_much():
    rng = np.random.default_rng(5)
    a, b = noisy(rng, 60, 10.0), noisy(rng, 60, 10.0)
    b[:6] *= 2.3  # 10 % of samples pre-empted on the treatment side only
    v = compare(a, b)
    assert v.verdict != Outcome.REGRESSION


def test_too_few_samples():
    v = compare([1.0, 1.1], [1.0, 1.2, 1.3, 1.4, 1.5])
    assert v.verdict == Outcome.UNKNOWN and v.change_pct is None
    assert "too few samples" in v.reason


def test_identical_values():
    assert compare([2.0] * 10, [2.0] * 10).verdict == Outcome.SAME
    v = compare([2.0] * 10, [3.0] * 10)
    assert v.verdict == Outcome.REGRESSION and v.change_pct == pytest.approx(50.0)


def test_zero_control_median_is_unknown():
    v = compare([0.0] * 10, [1.0] * 10)
    assert v.verdict == Outcome.UNKNOWN and "undefined" in v.reason


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_rejected(bad):
    with pytest.raises(ValueError, match="treatment: sample 2 is .* must be finite"):
        compare([1.0] * 10, [1.0, 1.0, bad] + [1.0] * 7)


def test_negative_samples_are_rejected():
    with pytest.raises(ValueError, match="control: sample 0 is negative"):
        compare([-1.0] + [1.0] * 9, [1.0] * 10)


def test_deterministic_for_a_seed():
    rng = np.random.default_rng(6)
    a, b = noisy(rng, 40, 5.0), noisy(rng, 40, 5.1)
    assert compare(a, b, seed=3) == compare(a, b, seed=3)


# The same 25 draws every run (derandomize): a false call of an A/A is allowed 1 % of the time,
# so 25 fresh random draws a run would flag one in some runs (CI met one: -1.07 % at 3 % noise);
# the rate itself is the next test's.
@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), cv=st.sampled_from([0.005, 0.01, 0.03]))
def test_aa_on_iid_noise_is_not_called_a_regression(seed, cv):
    """Identical distributions are not flagged, on a fixed set of draws (the per-comparison
    bound is 1 %: measured over 300 pairs below)."""
    rng = np.random.default_rng(seed)
    v = compare(noisy(rng, 50, 10.0, cv), noisy(rng, 50, 10.0, cv))
    assert v.verdict not in (Outcome.REGRESSION, Outcome.IMPROVEMENT)


def test_aa_false_positive_rate_is_within_bound():
    """Over 300 simulated A/A pairs (lognormal noise plus 8 % pre-empted samples) at most 1 % flag."""
    rng = np.random.default_rng(7)
    flagged = 0
    for _ in range(300):
        a, b = noisy(rng, 50, 10.0, 0.015), noisy(rng, 50, 10.0, 0.015)
        for side in (a, b):
            side[rng.random(50) < 0.08] *= 2.3
        flagged += compare(a, b, resamples=500).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    assert flagged <= 3


def _processes(rng, k, m, median, process_cv=0.02, sample_cv=0.015):
    """k processes of m samples; each process runs a little fast or slow as a whole."""
    values = np.concatenate([median * rng.lognormal(rng.normal(0, process_cv), sample_cv, m) for _ in range(k)])
    return values, np.repeat(np.arange(k), m)


def test_process_level_analysis_keeps_aa_false_positives_down():
    """Pooling samples of correlated processes cries wolf; treating the process as unit does not."""
    rng = np.random.default_rng(8)
    pooled = grouped = 0
    for i in range(150):
        a, ga = _processes(rng, 12, 5, 10.0)
        b, gb = _processes(rng, 12, 5, 10.0)
        pooled += compare(a, b, resamples=500, seed=i).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
        grouped += compare(a, b, control_groups=ga, treatment_groups=gb, resamples=500,
                           seed=i).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    assert grouped <= 2
    assert pooled > grouped  # the reason the driver passes groups


def test_grouped_detects_a_real_slowdown():
    rng = np.random.default_rng(9)
    a, ga = _processes(rng, 12, 5, 10.0)
    b, gb = _processes(rng, 12, 5, 10.6)
    v = compare(a, b, control_groups=ga, treatment_groups=gb)
    assert v.verdict == Outcome.REGRESSION and 3.0 < v.change_pct < 9.0


def test_groups_must_label_every_sample():
    with pytest.raises(ValueError, match="control_groups: 3 labels for 10 samples"):
        compare([1.0] * 10, [1.0] * 10, control_groups=[1, 2, 3])


def test_too_few_processes_is_unknown():
    v = compare([1.0, 1.1] * 5, [1.2, 1.3] * 5, control_groups=[0, 1] * 5, treatment_groups=[0, 1] * 5)
    assert v.verdict == Outcome.UNKNOWN and "2 processes" not in v.reason and "in 3 processes" in v.reason


def test_fdr_matches_scipy_and_statsmodels_reference_values():
    """BH-adjusted p-values for a small vector, against values worked out by hand from
    the BH definition (p * m / rank, made monotone from the largest p down)."""
    from abwatch.service.stats import adjust_fdr

    ps = [0.01, 0.04, 0.03, 0.005, 0.2]
    expected = [0.025, 0.05, 0.05, 0.025, 0.2]
    verdicts = [compare([10.0] * 10, [10.0] * 10)] * len(ps)
    verdicts = [replace(v, p_value=p, change_pct=5.0, ci_pct=(2.0, 8.0)) for v, p in zip(verdicts, ps, strict=False)]
    adjusted = adjust_fdr(verdicts)
    assert [a.p_adjusted for a in adjusted] == pytest.approx(expected)
    assert all(a.correction == "benjamini-hochberg" for a in adjusted)
    # alpha 0.01: raw p 0.005 and 0.01 are not both significant after correction
    assert [a.verdict for a in adjusted] == [Outcome.UNKNOWN] * 5
    assert [v.p_value for v in adjusted] == ps  # the raw p-values are kept


def test_fdr_keeps_a_strong_signal_and_passes_untested_through():
    from abwatch.service.stats import adjust_fdr

    rng = np.random.default_rng(10)
    strong = compare(noisy(rng, 60, 10.0), noisy(rng, 60, 11.0))
    untested = compare([1.0], [1.0])
    out = adjust_fdr([strong, untested, compare(noisy(rng, 60, 10.0), noisy(rng, 60, 10.0))])
    assert out[0].verdict == Outcome.REGRESSION and out[0].p_adjusted >= out[0].p_value
    assert out[1] == untested


def _pairs_data(rng, k, change, cv=0.01, m=5):
    """k paired processes of m samples: flat samples and process labels of both sides."""
    a, b, ga, gb = [], [], [], []
    for i in range(k):
        a += list(10.0 * rng.lognormal(rng.normal(0, cv / 2), cv, m))
        b += list(10.0 * (1 + change) * rng.lognormal(rng.normal(0, cv / 2), cv, m))
        ga += [i] * m
        gb += [i] * m
    return a, b, ga, gb


def test_confidence_sequence_is_undecided_below_min_pairs_and_tightest_near_the_plan():
    from abwatch.service.stats import MIN_PAIRS, cs_multiplier

    assert cs_multiplier(MIN_PAIRS - 1, 0.01) == math.inf
    widths = {n: cs_multiplier(n, 0.01, plan=30) for n in (8, 15, 30, 60, 1000)}
    assert widths[8] > widths[15] > widths[30]
    assert widths[1000] > widths[60]  # the price of validity at every n: it widens again, slowly
    assert 2.576 < widths[30] < 4.0  # wider than one fixed-n 99 % interval, not absurdly


@given(z=st.floats(-8, 8), n=st.integers(8, 500), alpha=st.sampled_from([0.001, 0.01, 0.05]))
@settings(max_examples=200, deadline=None)
def test_anytime_p_value_is_below_alpha_exactly_when_the_interval_excludes_zero(z, n, alpha):
    from abwatch.service.stats import cs_multiplier, cs_p_value

    excluded = abs(z) > cs_multiplier(n, alpha)
    p = cs_p_value(z, n, alpha)
    assert 0.0 <= p <= 1.0
    if abs(abs(z) - cs_multiplier(n, alpha)) > 1e-6:
        assert (p < alpha) == excluded


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_looking_after_every_pair_keeps_aa_false_positives_within_alpha():
    """Anytime validity: an A/A trial judged after every single pair, up to 80 pairs."""
    from abwatch.service.stats import Budget, sequential_look

    rng = np.random.default_rng(11)
    flagged, budget = 0, Budget(max_seconds=1e9, max_pairs=80, batch=1)
    for trial in range(150):
        a, b, ga, gb = _pairs_data(rng, 80, 0.0, cv=0.02)
        k, look = 4, 0
        while True:
            look += 1
            step = sequential_look(a[:5 * k], b[:5 * k], ga[:5 * k], gb[:5 * k], look=look, elapsed_s=0.0,
                                   budget=budget, threshold_pct=0.5, seed=trial)
            if step.verdict.verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT):
                flagged += 1
            if step.stop:
                break
            k += step.next_pairs
    assert flagged <= 3  # 2 % of 150: alpha is 1 %, with room for chance


def _looked_until_stopped(rng, change: float, seed: int, most: int = 100) -> Outcome:
    """One trial judged after every batch of 4 pairs, as the driver would, up to ``most`` pairs."""
    from abwatch.service.stats import Budget, sequential_look

    a, b, ga, gb = _pairs_data(rng, most, change, cv=0.02)
    budget, k, look = Budget(max_seconds=1e9, max_pairs=most, batch=4), 8, 0
    while True:
        look += 1
        step = sequential_look(a[:5 * k], b[:5 * k], ga[:5 * k], gb[:5 * k], look=look, elapsed_s=0.0,
                               budget=budget, seed=seed)
        if step.stop:
            return step.verdict.verdict
        k += step.next_pairs


def test_same_is_two_one_sided_tests_on_the_narrower_interval():
    rng = np.random.default_rng(21)
    a, b, ga, gb = _pairs_data(rng, 30, 0.0, cv=0.01)
    strict = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True, equivalence_alpha=0.005)
    tost = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True)  # 0.05 a side: a 90 % interval
    (low, high), (same_low, same_high) = tost.ci_pct, tost.same_ci_pct
    assert low < same_low < tost.change_pct < same_high < high  # same centre, narrower
    # at 0.005 a side the equivalence interval is the reported 99 % one
    assert strict.same_ci_pct == pytest.approx(strict.ci_pct)
    assert strict.verdict == Outcome.UNKNOWN  # these 30 pairs: not yet at 0.005 a side...
    assert tost.verdict == Outcome.SAME and "90% CI" in tost.reason  # ...but at 0.05
    with pytest.raises(ValueError):
        compare(a, b, equivalence_alpha=0.5)


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_same_is_rarely_claimed_at_the_threshold_and_never_at_twice_it():
    """`same` claims |change| < 1 %: at a true +1 % (the boundary) TOST allows 5 %, at +2 % none,
    under optional stopping after every batch; A/A trials mostly end `same`."""
    rng = np.random.default_rng(22)
    boundary = [_looked_until_stopped(rng, 0.01, seed) for seed in range(120)]
    twice = [_looked_until_stopped(rng, 0.02, seed) for seed in range(60)]
    aa = [_looked_until_stopped(rng, 0.0, seed) for seed in range(60)]
    assert boundary.count(Outcome.SAME) <= 9  # 7.5 % of 120: 5 % with room for chance
    assert Outcome.SAME not in twice
    assert aa.count(Outcome.SAME) >= 50


def test_sequential_look_stops_when_decided_capped_or_out_of_time():
    from abwatch.service.stats import Budget, sequential_look

    rng = np.random.default_rng(12)
    a, b, ga, gb = _pairs_data(rng, 12, 0.10)
    decided = sequential_look(a, b, ga, gb, look=2, elapsed_s=3.0, budget=Budget(max_seconds=100))
    assert decided.stop and decided.verdict.verdict == Outcome.REGRESSION
    assert decided.verdict.stop_reason == "decided at look 2, 12 pairs, 3.0s"
    assert (decided.verdict.looks, decided.verdict.elapsed_s, decided.next_pairs) == (2, 3.0, 0)

    a, b, ga, gb = _pairs_data(rng, 12, 0.0, cv=0.2)  # far too noisy to decide
    more = sequential_look(a, b, ga, gb, look=1, elapsed_s=12.0, budget=Budget(max_seconds=100, batch=6))
    assert not more.stop and more.next_pairs == 6 and more.verdict.verdict == Outcome.UNKNOWN
    # 1 s a pair so far, 3.5 s left: the next batch shrinks to what fits
    short = sequential_look(a, b, ga, gb, look=1, elapsed_s=12.0, budget=Budget(max_seconds=15.5, batch=6))
    assert not short.stop and short.next_pairs == 3
    out = sequential_look(a, b, ga, gb, look=4, elapsed_s=12.0, budget=Budget(max_seconds=12.5))
    assert out.stop and out.verdict.stop_reason == "time budget spent (12.5s) at look 4, 12 pairs, 12.0s"
    capped = sequential_look(a, b, ga, gb, look=3, elapsed_s=1.0, budget=Budget(max_seconds=100, max_pairs=12))
    assert capped.stop and capped.verdict.stop_reason.startswith("invocation cap reached (12 a side) at look 3")
    with pytest.raises(ValueError):
        Budget(max_seconds=0)


def test_paired_interval_is_symmetric_on_the_log_scale_despite_an_outlier_pair():
    """A pre-empted process in one pair must not stretch one side of the interval (the
    +10 % change whose bootstrap interval read 7.9..48.7 %)."""
    rng = np.random.default_rng(13)
    a, b, ga, gb = _pairs_data(rng, 12, 0.10)
    b[-5:] = [x * 2.3 for x in b[-5:]]  # the last treatment process ran entirely pre-empted
    v = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True)
    low, high = (math.log1p(x / 100) for x in v.ci_pct)
    centre = math.log1p(v.change_pct / 100)
    assert centre - low == pytest.approx(high - centre)
    assert 7.0 < v.change_pct < 13.0 and v.ci_pct[1] < 20.0


def test_few_pooled_samples_get_the_hodges_lehmann_shift():
    from abwatch.service.stats.pooled import SMALL_POOLED_METHOD

    rng = np.random.default_rng(14)
    a, b = noisy(rng, 30, 10.0), noisy(rng, 30, 10.5)
    v = compare(a, b)
    shift = np.median(np.subtract.outer(np.log(b), np.log(a)))
    assert v.method == SMALL_POOLED_METHOD and v.change_pct == pytest.approx((math.exp(shift) - 1) * 100)
    assert v.ci_pct[0] < v.change_pct < v.ci_pct[1] and v.verdict == Outcome.REGRESSION


def _loaded(rng, k, median, m=5, preempted=(0.5, 0.9)):
    """k processes of m samples on a loaded machine: a process offset of ~2 %, and 50-90 %
    of a process's samples pre-empted 2-5x (the bimodal samples of a 2-core box at load 6-8)."""
    out = []
    for _ in range(k):
        v = median * rng.lognormal(rng.normal(0, 0.02), 0.015, m)
        slow = rng.random(m) < rng.uniform(*preempted)
        v[slow] *= rng.uniform(2, 5, slow.sum())
        out.extend(v)
    return np.array(out)


def test_pooled_quantile_shift_matches_its_definition():
    from abwatch.service.stats.pooled import POOLED_METHOD, quantile_shift

    rng = np.random.default_rng(15)
    a, b = noisy(rng, 60, 10.0), noisy(rng, 60, 10.5)
    v = compare(a, b)
    shift = np.quantile(np.log(b), 0.1) - np.quantile(np.log(a), 0.1)
    assert v.method == POOLED_METHOD and v.change_pct == pytest.approx((math.exp(shift) - 1) * 100)
    assert (v.change_pct, v.ci_pct, v.p_value) == quantile_shift(a, b, 0.99)
    assert v.ci_pct[0] > 0 and v.verdict == Outcome.REGRESSION


def test_pooled_quantile_shift_is_valid_on_independent_samples():
    """A/A on independent samples, three shapes, 60 a side: at most 1 % called (the
    fastest-fifth rule this replaces called 1.2-3 % at 3 % noise)."""
    rng = np.random.default_rng(16)
    called = 0
    for i in range(600):
        shape = i % 3
        if shape == 0:
            a, b = noisy(rng, 60, 10.0, 0.03), noisy(rng, 60, 10.0, 0.03)
        elif shape == 1:  # independent samples, 70 % pre-empted 2-5x
            a, b = (10.0 * rng.lognormal(0, 0.015, 60) * np.where(rng.random(60) < 0.7, rng.uniform(2, 5, 60), 1.0)
                    for _ in range(2))
        else:
            a, b = 10.0 * (1 + rng.pareto(3.0, 60)), 10.0 * (1 + rng.pareto(3.0, 60))
        called += compare(a, b).verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    assert called <= 6


def test_pooled_quantile_shift_detects_a_clear_shift_under_preemption():
    """+5 % on a loaded machine, 60 samples a side: the clean mode moves and is found, where
    the median of all samples (a pre-empted one) is mostly scheduler noise."""
    rng = np.random.default_rng(17)
    found = sum(compare(_loaded(rng, 12, 10.0), _loaded(rng, 12, 10.5)).verdict == Outcome.REGRESSION
                for _ in range(40))
    assert found >= 12  # LNT's rule on these data: ~23 % (docs/statistics.md)
    v = compare(_loaded(rng, 40, 10.0), _loaded(rng, 40, 11.0))
    assert v.verdict == Outcome.REGRESSION and 5.0 < v.change_pct < 15.0


def test_pooled_interval_is_symmetric_on_a_symmetric_process():
    """Symmetric noise, no change: the interval is centred on the estimate (log scale) and
    holds 0."""
    rng = np.random.default_rng(18)
    v = compare(10.0 * np.exp(rng.normal(0, 0.01, 80)), 10.0 * np.exp(rng.normal(0, 0.01, 80)))
    low, high = (math.log1p(x / 100) for x in v.ci_pct)
    centre = math.log1p(v.change_pct / 100)
    assert centre - low == pytest.approx(high - centre)
    assert low < 0 < high and v.verdict == Outcome.SAME


def test_design_effect_sees_runs_in_record_order_only():
    from abwatch.service.stats.pooled import design_effect

    rng = np.random.default_rng(19)
    # one process in five runs clean, the others entirely pre-empted: fast samples come in runs
    log = np.log(np.concatenate([noisy(rng, 5, 10.0) * (1.0 if rng.random() < 0.2 else 2.5) for _ in range(40)]))
    assert design_effect(log, 0.1) > 2.0
    assert design_effect(rng.permutation(log), 0.1) < 2.0
    assert design_effect(np.log(noisy(rng, 200, 10.0)), 0.1) < 2.0


def test_process_cv_uses_each_process_fastest_sample():
    from abwatch.service.stats import process_cv

    values = [10.0, 10.0, 30.0] + [11.0, 11.0, 25.0] + [12.0, 12.0, 12.0]  # pre-empted samples inside
    assert process_cv(values, [0] * 3 + [1] * 3 + [2] * 3) == pytest.approx(np.std([10, 11, 12], ddof=1) / 11)
    with pytest.raises(ValueError):
        process_cv([1.0, 2.0], [0, 0])


def test_planned_repetitions_grow_with_noise_and_shrink_with_the_target():
    from abwatch.service.stats import planned_repetitions

    from abwatch.service.stats import MIN_PAIRS, cs_multiplier

    n = planned_repetitions(0.01, 2.0, 0.01, 0.95)
    # the smallest n with sqrt(2) cv (m(n) + z_.95) / sqrt(n) <= 2 %
    fits = lambda k: math.sqrt(2) * 0.01 * (cs_multiplier(k, 0.01) + 1.6449) / math.sqrt(k) <= 0.02  # noqa: E731
    assert fits(n) and not fits(n - 1)
    assert planned_repetitions(0.02, 2.0, 0.01) > n
    assert planned_repetitions(0.01, 5.0, 0.01) < n
    assert planned_repetitions(0.0, 2.0, 0.01) == MIN_PAIRS


def _phased_pairs(rng, k, m, change, phase_cv=0.03, process_cv=0.005, sample_cv=0.01):
    """k interleaved pairs; each pair shares a machine 'phase' (both processes slow or fast)."""
    a, b, ga, gb = [], [], [], []
    for i in range(k):
        phase = rng.lognormal(0, phase_cv)
        a += list(10.0 * phase * rng.lognormal(rng.normal(0, process_cv), sample_cv, m))
        b += list(10.0 * (1 + change) * phase * rng.lognormal(rng.normal(0, process_cv), sample_cv, m))
        ga += [2 * i] * m
        gb += [2 * i + 1] * m
    return a, b, ga, gb


def test_pairing_cancels_shared_machine_phases():
    """With 3 % phases shared by both processes of a pair, only the paired analysis sees +2 %."""
    rng = np.random.default_rng(12)
    paired_hits = unpaired_hits = 0
    for i in range(40):
        a, b, ga, gb = _phased_pairs(rng, 16, 5, 0.02)
        common = dict(control_groups=ga, treatment_groups=gb, resamples=500, seed=i)
        paired_hits += compare(a, b, paired=True, **common).verdict == Outcome.REGRESSION
        unpaired_hits += compare(a, b, **common).verdict == Outcome.REGRESSION
    assert paired_hits >= 36  # >= 90 % power at +2 %
    assert unpaired_hits < paired_hits


def test_paired_aa_false_positives_within_bound():
    rng = np.random.default_rng(13)
    flagged = 0
    for i in range(200):
        a, b, ga, gb = _phased_pairs(rng, 12, 5, 0.0)
        v = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True, resamples=300, seed=i)
        flagged += v.verdict in (Outcome.REGRESSION, Outcome.IMPROVEMENT)
    assert flagged <= 2  # <= 1 %


def test_paired_estimate_is_near_the_truth():
    rng = np.random.default_rng(14)
    a, b, ga, gb = _phased_pairs(rng, 16, 5, 0.05)
    v = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True)
    assert v.verdict == Outcome.REGRESSION and 4.0 < v.change_pct < 6.0
    assert v.ci_pct[0] < v.change_pct < v.ci_pct[1]


def test_fdr_agrees_with_statsmodels_on_random_p_values():
    from statsmodels.stats.multitest import multipletests

    from abwatch.service.stats import adjust_fdr

    rng = np.random.default_rng(15)
    ps = list(np.concatenate([rng.uniform(0, 1, 15), rng.uniform(0, 0.001, 5)]))
    template = replace(compare([10.0] * 10, [10.0] * 10), change_pct=5.0, ci_pct=(2.0, 8.0))
    adjusted = adjust_fdr([replace(template, p_value=float(p)) for p in ps])
    reference = multipletests(ps, alpha=0.01, method="fdr_bh")
    assert [a.p_adjusted for a in adjusted] == pytest.approx(list(reference[1]))
    assert [a.verdict == Outcome.REGRESSION for a in adjusted] == list(reference[0])


def test_a_verdict_goes_to_json_and_back_whole():
    """One codec (Verdict.to_dict / from_dict) for every place a verdict is stored or sent:
    nothing is lost on the way, the equivalence interval and its alpha included."""
    import json
    import random

    from abwatch.service.stats.verdict import Verdict

    rng = random.Random(3)
    control = [10 + rng.random() for _ in range(40)]
    treatment = [11 + rng.random() for _ in range(40)]
    groups = [i // 4 for i in range(40)]
    for v in (compare(control, treatment, control_groups=groups, treatment_groups=groups), compare([], [])):
        again = Verdict.from_dict(json.loads(json.dumps(v.to_dict())))
        assert again == v
    decided = compare(control, treatment, control_groups=groups, treatment_groups=groups)
    assert decided.to_dict()["verdict"] == decided.verdict.value and isinstance(decided.to_dict()["ci_pct"], list)
    assert Verdict.from_dict({**decided.to_dict(), "run_id": 7}) == decided  # keys beside it are left out


def test_judged_figures_never_contradict_the_verdict():
    # Processes whose medians say "faster" while their fastest samples say "slower" (the treatment's
    # processes were pre-empted less): the figures a report shows are the judged ones, so a
    # regression's treatment figure is above its control's, an improvement's below, always.
    import numpy as np

    rng = np.random.default_rng(7)
    seen, contradicted = set(), 0
    for trial in range(60):
        step = rng.choice([0.9, 1.0, 1.12])
        control, treatment, cg, tg = [], [], [], []
        for process in range(20):
            for out, groups, factor, busy in ((control, cg, 1.0, 0.7), (treatment, tg, step, 0.2)):
                base = 2.0 * factor * (1 + rng.normal(0, 0.005))
                samples = base * np.where(rng.random(30) < busy, rng.uniform(1.5, 3.0, 30), 1 + rng.exponential(0.01, 30))
                out.extend(samples.tolist())
                groups.extend([process] * 30)
        v = compare(control, treatment, control_groups=cg, treatment_groups=tg, paired=True, threshold_pct=2.0)
        seen.add(v.verdict)
        assert v.control_ms is not None and "fastest sample per process" in v.estimator
        if v.verdict == Outcome.REGRESSION:
            assert v.treatment_ms > v.control_ms, trial
            assert v.treatment_ci_ms()[0] > v.control_ms
            contradicted += v.treatment_median_ms < v.control_median_ms
        elif v.verdict == Outcome.IMPROVEMENT:
            assert v.treatment_ms < v.control_ms, trial
    assert {Outcome.REGRESSION, Outcome.IMPROVEMENT} <= seen
    assert contradicted > 0  # the plain medians said "faster" for some regressions: why they are not the figures


def test_too_few_pairs_give_no_interval_and_a_storable_verdict():
    # under MIN_PAIRS the confidence sequence is unbounded: no interval at all (not [-100, inf],
    # which PostgreSQL's json refuses), and the verdict's dict is plain JSON
    import json

    from abwatch.service.stats import MIN_PAIRS

    pairs = MIN_PAIRS - 2
    control = [1.0 + 0.01 * i for i in range(pairs) for _ in range(3)]
    treatment = [1.1 + 0.01 * i for i in range(pairs) for _ in range(3)]
    groups = [i for i in range(pairs) for _ in range(3)]
    v = compare(control, treatment, control_groups=groups, treatment_groups=groups, paired=True)
    assert v.verdict == Outcome.UNKNOWN and v.ci_pct is None and "too few pairs" in v.reason
    json.loads(json.dumps(v.to_dict(), allow_nan=False))


def test_the_fdr_correction_keeps_the_judged_figures():
    from abwatch.service.stats import adjust_fdr

    groups = [i for i in range(12) for _ in range(3)]
    control = [1.0 + 0.001 * (i % 5) for i in range(36)]
    treatment = [1.2 + 0.001 * (i % 7) for i in range(36)]
    v = compare(control, treatment, control_groups=groups, treatment_groups=groups, paired=True)
    (adjusted,) = adjust_fdr([v])
    assert adjusted.correction == "benjamini-hochberg"
    assert (adjusted.control_ms, adjusted.treatment_ms, adjusted.estimator) == (v.control_ms, v.treatment_ms,
                                                                                 v.estimator)



def test_where_higher_is_better_a_drop_is_the_regression_and_a_rise_the_improvement():
    """A rate (an LLM's tokens per second) judged with ``higher_is_better``: 5 % fewer is a
    regression, 5 % more an improvement; the change keeps its sign (the treatment's over the
    control's), and the same data judged as a time reads the other way."""
    rng = np.random.default_rng(21)
    for change, worse in ((-0.05, True), (0.05, False)):
        a, b, ga, gb = _phased_pairs(rng, 16, 5, change)
        common = dict(control_groups=ga, treatment_groups=gb, paired=True)
        rate = compare(a, b, higher_is_better=True, **common)
        assert rate.verdict == (Outcome.REGRESSION if worse else Outcome.IMPROVEMENT), rate.reason
        assert rate.higher_is_better and 4.0 < abs(rate.change_pct) < 6.0 and (rate.change_pct < 0) == worse
        assert rate.reason.startswith("lower by" if worse else "higher by")
        assert "highest sample per process" in rate.estimator
        as_time = compare(a, b, **common)
        assert as_time.verdict == (Outcome.IMPROVEMENT if worse else Outcome.REGRESSION)
        assert not as_time.higher_is_better and as_time.change_pct == pytest.approx(rate.change_pct, abs=1.5)


def test_a_rate_and_its_time_are_judged_alike():
    """Tokens per second is 1000 / ms per token, sample by sample: each process's highest rate is
    its fastest time, so the two verdicts agree exactly, the changes are each other's reciprocal."""
    rng = np.random.default_rng(22)
    for change in (0.04, 0.0, -0.04):
        a, b, ga, gb = _phased_pairs(rng, 12, 5, change)
        common = dict(control_groups=ga, treatment_groups=gb, paired=True, threshold_pct=2.0)
        time = compare(a, b, **common)
        rate = compare([1000 / x for x in a], [1000 / x for x in b], higher_is_better=True, **common)
        assert rate.verdict == time.verdict and rate.p_value == pytest.approx(time.p_value)
        assert 1 + rate.change_pct / 100 == pytest.approx(1 / (1 + time.change_pct / 100))
        assert rate.ci_pct[0] == pytest.approx((1 / (1 + time.ci_pct[1] / 100) - 1) * 100)
        assert rate.control_ms == pytest.approx(1000 / time.control_ms, rel=1e-3)  # medians of an even count


def test_the_direction_survives_the_fdr_correction_pooled_samples_and_json():
    import json

    from abwatch.service.stats import adjust_fdr
    from abwatch.service.stats.verdict import Verdict

    rng = np.random.default_rng(23)
    a, b, ga, gb = _phased_pairs(rng, 16, 5, -0.05)
    rate = compare(a, b, control_groups=ga, treatment_groups=gb, paired=True, higher_is_better=True)
    (adjusted,) = adjust_fdr([rate])
    assert adjusted.verdict == Outcome.REGRESSION and adjusted.higher_is_better
    assert "lower by" in adjusted.reason and "BH-adjusted" in adjusted.reason
    assert Verdict.from_dict(json.loads(json.dumps(rate.to_dict()))) == rate
    # pooled samples (no processes): a rate judged by its high tail, a drop still the regression
    pooled = compare(noisy(rng, 80, 500.0), noisy(rng, 80, 470.0), higher_is_better=True)
    assert pooled.verdict == Outcome.REGRESSION and pooled.change_pct < -3
    assert compare(noisy(rng, 80, 500.0), noisy(rng, 80, 470.0)).verdict == Outcome.IMPROVEMENT  # the default
