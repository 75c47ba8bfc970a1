"""Samples a process and children a fork server chosen from the variance components
(service/stats/repetitions.py)."""

from __future__ import annotations

import numpy as np
import pytest

from abwatch.service.stats.levels import MIN_BLOCKS
from abwatch.service.stats.repetitions import HORIZON, choose_children, choose_samples


def _processes(rng, count: int, samples: int, process_sd: float, sample_tail: float) -> list[list[float]]:
    """Processes whose level varies by ``process_sd`` (relative) and whose samples are that level
    plus an exponential tail (interference) of mean ``sample_tail`` (relative)."""
    levels = 1.0 + process_sd * rng.standard_normal(count)
    return [list(level * (1.0 + rng.exponential(sample_tail, samples))) for level in levels]


def test_cheap_processes_with_steady_levels_take_few_samples():
    """Where a process's fixed part is cheap and its fastest sample is reached within a few
    samples, fewer samples reach the same width sooner: the choice goes down, and says so."""
    rng = np.random.default_rng(1)
    processes = _processes(rng, 40, 100, process_sd=0.01, sample_tail=0.002)
    choice = choose_samples(processes, fixed_s=0.01, sample_s=0.002, configured=100)
    assert choice.samples < 100
    best = min(choice.options, key=lambda o: o.relative_time)
    assert choice.samples == best.samples and best.relative_time < 0.8
    assert f"{choice.samples} samples a process (" in choice.reason and "less time to the same width than 100" in choice.reason


def test_dear_processes_keep_many_samples():
    """Where starting a process is what costs (a fresh TVM worker: ~1 s against 1.5 ms a
    sample) and few samples rarely reach the process's floor, the configured count stays."""
    rng = np.random.default_rng(2)
    processes = _processes(rng, 40, 100, process_sd=0.005, sample_tail=0.2)
    choice = choose_samples(processes, fixed_s=1.0, sample_s=0.0015, configured=100)
    assert choice.samples == 100 and choice.reason.startswith("100 samples a process (configured; ")
    assert {o.samples for o in choice.options} == {5, 10, 20, 50, 100}  # none above what was taken
    assert next(o for o in choice.options if o.samples == 100).relative_time == pytest.approx(1.0)


def test_processes_judged_by_their_mean_cpu_time_weigh_the_mean_of_their_first_samples():
    """Under heavy contention a process is judged by the mean of its samples' CPU times, which
    are moved both ways (caches) around a level that varies between processes. At the
    measured figures of builtin:mlp beside six busy loops (the processes' level 2.6 %, a
    sample's CPU time 3 % about it, a process 0.15 s besides 65 ms a sample) more samples
    hardly narrow the spread, so fewer reach the width sooner; each count's spread is the
    mean's, narrower than the fastest's (the minimum of symmetric noise is itself noisy)."""
    rng = np.random.default_rng(4)
    levels = 1.0 + 0.026 * rng.standard_normal(66)
    processes = [list(level * (1.0 + 0.03 * rng.standard_normal(20))) for level in levels]
    mean = choose_samples(processes, fixed_s=0.15, sample_s=0.065, configured=20, typical=np.mean)
    assert mean.samples == 5 and "less time to the same width than 20" in mean.reason
    cv = {o.samples: o.process_cv for o in mean.options}
    assert cv[20] > 0.8 * cv[5]  # the between-process level dominates
    fastest = choose_samples(processes, fixed_s=0.15, sample_s=0.065, configured=20)
    assert all(o.process_cv > cv[o.samples] for o in fastest.options)


def test_a_run_that_found_a_change_teaches_the_count_its_processes_show():
    """Counts are learnt from every trusted run, a `regression` included: each side is taken on
    its own scale, so a 10 % difference between the sides chooses what the same processes
    without it would. Pooled raw, the difference adds one spread to every count's and the
    cheapest count looks best (here 5 samples, where 50 reach the width sooner)."""
    rng = np.random.default_rng(7)
    processes = _processes(rng, 40, 100, process_sd=0.003, sample_tail=0.05)
    sides = ["control"] * 20 + ["treatment"] * 20
    slower = [p if side == "control" else [1.1 * x for x in p] for p, side in zip(processes, sides, strict=True)]
    alike = choose_samples(processes, fixed_s=0.05, sample_s=0.002, configured=100, sides=sides)
    found = choose_samples(slower, fixed_s=0.05, sample_s=0.002, configured=100, sides=sides)
    assert found.samples == alike.samples >= 50, (found.reason, alike.reason)
    assert [o.process_cv for o in found.options] == pytest.approx([o.process_cv for o in alike.options])
    pooled = choose_samples(slower, fixed_s=0.05, sample_s=0.002, configured=100)
    assert pooled.samples == 5 and all(o.process_cv > 0.04 for o in pooled.options), pooled.reason


def test_the_first_samples_are_what_a_shorter_process_takes():
    """cv(n) is taken over each process's first n samples, in the order taken: processes whose
    fast samples come after their tenth spread widely at 10 samples and not from 20 on, so 20
    (the cheapest of the steady counts) is chosen."""
    levels = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00]
    late = [[2.0 + i / 10] * 10 + [level] * 90 for i, level in enumerate(levels)]
    choice = choose_samples(late, fixed_s=0.0, sample_s=0.001, configured=100)
    by = {o.samples: o for o in choice.options}
    slow = [2.0 + i / 10 for i in range(6)]  # at 10 samples the fast ones are not reached yet
    assert by[10].process_cv == pytest.approx(np.std(slow, ddof=1) / np.mean(slow))
    assert by[10].process_cv > 3 * by[20].process_cv
    assert by[20].process_cv == pytest.approx(by[100].process_cv)
    assert choice.samples == 20 and by[20].relative_time == pytest.approx(0.2)


@pytest.mark.parametrize(("processes", "fixed", "sample", "configured", "message"), [
    ([[1.0] * 10] * 5, 0.1, 0.001, 10, "at least 6 processes"),
    ([[1.0] * 10] * 6, -1.0, 0.001, 10, "fixed_s must be >= 0"),
    ([[1.0] * 10] * 6, 0.1, 0.0, 10, "sample_s > 0"),
    ([[1.0] * 10] * 6, 0.1, 0.001, 20, "the configured 20 samples, the fewest took 10"),
])
def test_bad_input_is_named(processes, fixed, sample, configured, message):
    with pytest.raises(ValueError, match=message):
        choose_samples(processes, fixed_s=fixed, sample_s=sample, configured=configured)


def _forked(rng, servers: int, children: int, layout_sd: float, process_sd: float = 0.01,
            treatment: float = 1.0) -> tuple[list[float], list, list[str]]:
    """Forked processes of two sides: each server's children share its layout's offset
    (relative sd ``layout_sd``), each child adds its own; the treatment's level is ``treatment``."""
    figures, labels, sides = [], [], []
    for side, level in (("control", 1.0), ("treatment", treatment)):
        for server in range(servers):
            offset = rng.normal(0.0, layout_sd)
            for _ in range(children):
                figures.append(level * float(np.exp(offset + rng.normal(0.0, process_sd))))
                labels.append((side, server))
                sides.append(side)
    return figures, labels, sides


def test_layouts_that_matter_take_fewer_children_and_none_is_ever_above_the_runners():
    """Kalibera & Jones's trade: where layouts move the time, children of one server are worth
    little (the design effect) against a server's start, and the choice goes down; where a
    server's start costs many children and its layout adds nothing, the runner's count stays.
    No count above the runner's is weighed: the server level's A/A rate was simulated up to 8
    children a server."""
    rng = np.random.default_rng(3)
    flat = choose_children(*_forked(rng, 8, 8, layout_sd=0.0), server_s=2.0, child_s=0.1, configured=8, pairs=60)
    layouts = choose_children(*_forked(rng, 8, 8, layout_sd=0.03), server_s=2.0, child_s=0.1, configured=8,
                              pairs=60)
    assert flat.rho < 0.2 and layouts.rho > 0.5, (flat.rho, layouts.rho)
    assert flat.children == 8 and layouts.children < 8, (flat.reason, layouts.reason)
    for choice in (flat, layouts):
        assert max(o.children for o in choice.options) == 8
        best = min(choice.options, key=lambda o: o.relative_time)
        assert best.relative_time == pytest.approx(1.0) and best.server_pairs >= MIN_BLOCKS
        assert f"{choice.children} children a fork server (" in choice.reason and "from 16 servers" in choice.reason
    assert layouts.children == min(layouts.options, key=lambda o: o.relative_time).children
    assert "less time to the same width than 8" in layouts.reason


def test_a_server_started_ahead_costs_only_what_its_predecessors_children_do_not_cover():
    """With servers started ahead (runners.fork_servers.TimedServers), a successor starts while
    its predecessor's children and the other side's run: at 8 children of 0.05 s (0.8 s of
    pairs) a 0.7 s start is hidden whole and a pair costs its two children; at 2 children
    (0.2 s) most of the start is still waited for. So started ahead, a count below the one
    that hides the start costs relatively more than where every start is paid in full."""
    figures = _forked(np.random.default_rng(6), 8, 8, layout_sd=0.0)
    paid = choose_children(*figures, server_s=0.7, child_s=0.05, configured=8, pairs=60)
    ahead = choose_children(*figures, server_s=0.7, child_s=0.05, configured=8, pairs=60, ahead=True)
    assert paid.rho == ahead.rho  # the same processes: only the costs differ
    time_paid = {o.children: o.relative_time for o in paid.options}
    time_ahead = {o.children: o.relative_time for o in ahead.options}
    # relative to 8 children: paid in full, 2 a server cost (0.05 + 0.35) / (0.05 + 0.0875) of
    # 8's a pair; ahead, (0.05 + 0.25) / 0.05 (8's start is hidden whole): both beyond 8 in cost
    # a pair, and the widening is the same in both, so the ratios of 2's to 8's compare so
    ratio_paid, ratio_ahead = time_paid[2] / time_paid[8], time_ahead[2] / time_ahead[8]
    assert ratio_ahead == pytest.approx(ratio_paid * (0.30 / 0.05) / (0.40 / 0.1375), rel=1e-9)
    assert "(started ahead)" in ahead.reason and "(started ahead)" not in paid.reason
    assert ahead.children == 8 and paid.children == 8, (ahead.reason, paid.reason)


def test_the_servers_share_is_estimated_without_the_sides_degree_of_freedom():
    """Each side's mean is taken out before the analysis of variance, which costs the servers'
    spread a degree of freedom: counted, a known share of 0.2 comes out about right; left
    uncounted, it comes out low, and the choice would lean to more children."""
    from abwatch.service.stats.levels import intraclass

    rng = np.random.default_rng(8)
    counted, uncounted = [], []
    for _ in range(500):
        values, group = [], []
        for side in range(2):
            offsets = rng.normal(0.0, np.sqrt(0.2), 5)
            one = np.array([offsets[s] + rng.normal(0.0, np.sqrt(0.8)) for s in range(5) for _ in range(5)])
            values.extend(one - one.mean())
            group.extend(side * 5 + s for s in range(5) for _ in range(5))
        counted.append(intraclass(np.array(values), np.array(group), fitted=2))
        uncounted.append(intraclass(np.array(values), np.array(group)))
    assert 0.16 < np.mean(counted) < 0.24 and np.mean(uncounted) < np.mean(counted) - 0.01, (
        np.mean(counted), np.mean(uncounted))


def test_a_count_without_an_interval_at_the_runs_pairs_is_timed_at_the_pairs_it_needs():
    """The runner's 8 children at the 12 pairs a quick verdict takes make two server pairs, too
    few for an interval; run longer, they give one: each count is timed at the pairs it needs
    to reach the width the best count reaches at 12 (for 8, four server pairs). Where layouts
    matter, many children a server never reach it within HORIZON times the pairs (their design
    effect is too large), and a smaller count replaces the configured one."""
    rng = np.random.default_rng(4)
    choice = choose_children(*_forked(rng, 6, 4, layout_sd=0.0), server_s=1.0, child_s=0.2, configured=8, pairs=12)
    by = {o.children: o for o in choice.options}
    assert by[8].server_pairs >= MIN_BLOCKS + 1 and 1.0 < by[8].relative_time < 1.2, by[8]
    assert by[4].server_pairs >= MIN_BLOCKS and min(o.relative_time for o in choice.options) == 1.0
    assert choice.children == 8 and "(configured; " in choice.reason  # no count is 20 % faster
    layouts = choose_children(*_forked(np.random.default_rng(4), 6, 4, layout_sd=0.03), server_s=1.0, child_s=0.2,
                              configured=32, pairs=16)
    by = {o.children: o for o in layouts.options}
    assert layouts.rho > 0.5 and by[32].relative_time == float("inf") and by[2].relative_time == 1.0, layouts
    assert layouts.children == 2 and f"32 do not reach that width within {HORIZON}x the pairs" in layouts.reason


def test_one_runs_high_servers_share_is_pooled_with_the_histories_before_the_count_is_chosen():
    """A run whose layouts seem to matter (its own rho above 0.5) alone takes fewer children;
    pooled with nine earlier runs that found none (rho 0), the share weighed is a tenth of its
    own and the runner's count stays. The choice keeps the run's own estimate apart (what the
    history folds in next) and says what it weighed."""
    figures = _forked(np.random.default_rng(3), 8, 8, layout_sd=0.03)
    alone = choose_children(*figures, server_s=2.0, child_s=0.1, configured=8, pairs=60)
    pooled = choose_children(*figures, server_s=2.0, child_s=0.1, configured=8, pairs=60, earlier=(0.0, 9))
    assert alone.rho == alone.run_rho > 0.5 and alone.children < 8, alone.reason
    assert pooled.run_rho == alone.run_rho and pooled.rho == pytest.approx(alone.run_rho / 10)
    assert pooled.children == 8, pooled.reason
    assert f"{pooled.rho:.2f} weighed as 10 runs, this run's {alone.run_rho:.2f} from 16 servers" in pooled.reason
    # a history of no runs is none: the run's own estimate alone
    assert choose_children(*figures, server_s=2.0, child_s=0.1, configured=8, pairs=60, earlier=(0.7, 0)) == alone


def test_a_real_difference_between_the_sides_is_not_a_servers_variance():
    """An A/B run's treatment 10 % slower throughout: each side's level is taken out before the
    servers' share is estimated, so it reads as no layout effect, not as a large one."""
    rng = np.random.default_rng(5)
    slower = choose_children(*_forked(rng, 8, 4, layout_sd=0.0, treatment=1.10), server_s=1.0, child_s=0.2,
                             configured=4, pairs=32)
    assert slower.rho < 0.3, slower.reason


def test_the_configured_count_stays_unless_another_is_much_cheaper():
    rng = np.random.default_rng(6)
    figures, labels, sides = _forked(rng, 8, 8, layout_sd=0.0)
    choice = choose_children(figures, labels, sides, server_s=0.2, child_s=0.2, configured=8, pairs=200)
    assert choice.children == 8 and choice.reason.startswith("8 children a fork server (configured; ")


@pytest.mark.parametrize(("servers", "children", "kwargs", "message"), [
    (1, 4, {}, "needs 4 servers of two children or more, got 2"),
    (4, 1, {}, "needs 4 servers of two children or more, got 0"),
    (4, 4, {"child_s": 0.0}, "child_s > 0"),
    (4, 4, {"pairs": 5}, r"5 pairs give no interval at any count \(8 are needed\)"),
])
def test_bad_input_to_the_children_choice_is_named(servers, children, kwargs, message):
    figures, labels, sides = _forked(np.random.default_rng(7), servers, children, layout_sd=0.0)
    options = {"server_s": 1.0, "child_s": 0.2, "configured": 8, "pairs": 16, **kwargs}
    with pytest.raises(ValueError, match=message):
        choose_children(figures, labels, sides, **options)


def test_the_children_are_weighed_at_the_samples_chosen_with_them():
    """One run teaches both counts: 100 samples of 1.7 ms after a 30 ms fixed part make a child
    of 0.2 s, and few samples reach the same width sooner. Weighed at 0.2 s, a child of each of
    2 servers hides most of a 0.63 s start started ahead, so 2 children a server look cheapest;
    but the children will take the few samples, a child then costs ~0.04 s, most of a start
    every 2 children would be waited for, and the runner's 8 are kept."""
    from abwatch.service.compare.noise import child_at

    processes = _processes(np.random.default_rng(11), 40, 100, process_sd=0.01, sample_tail=0.002)
    samples = choose_samples(processes, fixed_s=0.03, sample_s=0.0017, configured=100)
    assert samples.samples < 20
    child = child_at(0.2, samples)
    by = {o.samples: o.seconds for o in samples.options}
    assert child == pytest.approx(0.2 - (by[100] - by[samples.samples])) and child < 0.05
    assert child_at(0.2, None) == 0.2  # no count learnt: the child as measured
    for seed in range(3):  # the servers' share of the variance about 0.15, as the quickstart's MLP showed
        figures = _forked(np.random.default_rng(20 + seed), 21, 8, layout_sd=0.0044)
        as_measured = choose_children(*figures, server_s=0.63, child_s=0.2, configured=8, pairs=168, ahead=True)
        as_it_will_be = choose_children(*figures, server_s=0.63, child_s=child, configured=8, pairs=168, ahead=True)
        assert as_measured.children == 2 and as_it_will_be.children == 8, (as_measured.reason, as_it_will_be.reason)


def test_the_children_are_weighed_at_the_pairs_the_learnt_samples_buy():
    """A teaching run of builtin:mlp at batch 128 beside six busy loops (measured: 100 samples a
    process, a child 13.0 s, 12 pairs in 300 s; 2 samples learnt, a child then 0.43 s; a server's
    start 1.03 s, no layout effect): weighed at its own 12 pairs only 2 children a server make
    three server pairs, and a next run of 0.43 s children would start a server every two; at
    the pairs the same time buys with those children, the runner's 8 are kept."""
    from abwatch.service.compare.noise import MAX_PAIRS_AHEAD, pairs_ahead

    ahead = pairs_ahead(12, 13.0, 0.43)
    assert ahead == 363 and pairs_ahead(12, 0.43, 0.43) == 12 and pairs_ahead(12, 13.0, 0.001) == MAX_PAIRS_AHEAD
    assert pairs_ahead(12, 0.2, 0.43) == 12  # never fewer than the run made
    for seed in range(3):
        figures = _forked(np.random.default_rng(30 + seed), 4, 3, layout_sd=0.0, process_sd=0.026)
        at_its_pairs = choose_children(*figures, server_s=1.03, child_s=0.43, configured=8, pairs=12, ahead=True)
        at_its_time = choose_children(*figures, server_s=1.03, child_s=0.43, configured=8, pairs=ahead, ahead=True)
        assert at_its_pairs.children < 8 and at_its_time.children == 8, (at_its_pairs.reason, at_its_time.reason)
