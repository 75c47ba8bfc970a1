"""The decisions apart from their persistence, without a database: which regressions a judged
workload opens (service.compare.decide), which commit a bisection tests next or names
(service.watch.bisect_search), which side of the culprit a step's comparisons put a commit
on (service.watch.bisect._judge), and a watched commit's status (service.watch.poll.status_of)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from abwatch.service import stats
from abwatch.service.compare import decide
from abwatch.service.compare.outcome import CompareOutcome, WorkloadResult
from abwatch.service.stats.verdict import Metric, Outcome, RegressionKind
from abwatch.service.store.models import StepSide
from abwatch.service.watch import bisect as watch_bisect, bisect_search, poll
from abwatch.service.watch.bisect_search import BAD, GOOD, SKIP
from abwatch.service.watch.poll import BUILD_FAILED, FAILED, OK

# --- the compare decision ---------------------------------------------------------------


def verdict(outcome: Outcome, change: float = 0.0, reason: str = "judged") -> stats.Verdict:
    ci = None if outcome == Outcome.UNKNOWN else (change - 1.0, change + 1.0)
    return stats.Verdict(outcome, change, ci, 0.001, 20, 20, 10.0, 10.0 * (1 + change / 100), 1.0, 0.01, 0.99,
                         reason)


SLOWER, FASTER = verdict(Outcome.REGRESSION, 8.0, "slower by 8%"), verdict(Outcome.IMPROVEMENT, -8.0)
SAME, UNKNOWN = verdict(Outcome.SAME), verdict(Outcome.UNKNOWN)
AGREE = {"max_abs": 0.0, "max_rel": 0.0, "mismatch": False, "reason": "", "rtol": 1e-5, "atol": 1e-6}


def found(first: stats.Verdict = SAME, *, measure=(Metric.TIME,), run=(), compile=(), output=None,
          benchmark=True) -> decide.Found:
    return decide.Found("w", tuple(measure), first, tuple(run), tuple(compile), output, benchmark)


def test_a_slower_first_metric_opens_a_runtime_regression_by_it():
    d = decide.decide(found(SLOWER))
    assert d.workload == "w"
    assert d.runtime == decide.Opening(RegressionKind.RUNTIME, Metric.TIME, SLOWER, None)
    assert d.compile_time is None and d.correctness is None and not d.mismatch
    assert not d.learn_noise and d.learn_counts  # a change is no noise; its processes' costs still teach


@pytest.mark.parametrize("first", [SAME, UNKNOWN, FASTER])
def test_same_unknown_or_faster_open_nothing(first):
    d = decide.decide(found(first))
    assert (d.runtime, d.compile_time, d.correctness) == (None, None, None)
    assert d.learn_noise == (first is SAME)  # only a `same` verdict's samples are the pair's noise
    assert d.learn_counts  # whatever the verdict: an `unknown` on a busy host most needs cheaper processes


def test_the_noise_of_unmerged_code_is_not_learnt():
    """A try or pull-request job's `same` teaches nothing: later runs of merged code start from a
    noise profile, which code nobody merged must not steer."""
    assert decide.decide(found(SAME)).learn_noise
    untrusted = replace(found(SAME), trusted=False)
    assert not decide.decide(untrusted).learn_noise and not decide.decide(untrusted).learn_counts


def test_another_metric_opens_where_the_first_did_not_regress():
    d = decide.decide(found(SAME, measure=(Metric.TIME, Metric.MAX_RSS), run=[(Metric.MAX_RSS, SLOWER)]))
    assert d.runtime is not None and d.runtime.metric == Metric.MAX_RSS
    # yet the comparison's own verdict (same) still teaches the noise profile
    assert d.learn_noise


def test_the_measure_order_picks_the_opener_not_the_order_judged():
    cpu_slower = verdict(Outcome.REGRESSION, 5.0)
    d = decide.decide(found(SAME, measure=(Metric.TIME, Metric.INSTRUCTIONS, Metric.CPU_TIME),
                            run=[(Metric.CPU_TIME, cpu_slower), (Metric.INSTRUCTIONS, SLOWER)]))
    assert d.runtime is not None and (d.runtime.metric, d.runtime.verdict) == (Metric.INSTRUCTIONS, SLOWER)
    # a metric the workload does not name comes after those it does
    assert decide.first_regression([Metric.TIME], [(Metric.MAX_RSS, SLOWER), (Metric.TIME, cpu_slower)]) \
        == (Metric.TIME, cpu_slower)


def test_a_slower_compile_opens_a_compile_time_regression_saying_which_measure():
    compile_slower = verdict(Outcome.REGRESSION, 12.0, "slower by 12.00%")
    d = decide.decide(found(SAME, compile=[(Metric.TIME, SAME), (Metric.INSTRUCTIONS, compile_slower)]))
    assert d.runtime is None
    assert d.compile_time is not None
    assert (d.compile_time.kind, d.compile_time.metric) == (RegressionKind.COMPILE_TIME, Metric.INSTRUCTIONS)
    assert d.compile_time.verdict is compile_slower
    assert d.compile_time.reason == "compile instructions slower by 12.00%"
    on_time = decide.decide(found(SAME, compile=[(Metric.TIME, compile_slower)])).compile_time
    assert on_time is not None and on_time.reason == "compile time slower by 12.00%"


def test_a_slower_run_and_compile_open_one_of_each_kind():
    d = decide.decide(found(SLOWER, compile=[(Metric.TIME, SLOWER)]))
    assert d.runtime is not None and d.runtime.kind == RegressionKind.RUNTIME
    assert d.compile_time is not None and d.compile_time.kind == RegressionKind.COMPILE_TIME


def test_differing_outputs_open_a_correctness_regression_whatever_the_speed():
    wrong = {**AGREE, "max_abs": 0.5, "max_rel": 0.25, "mismatch": True}
    d = decide.decide(found(FASTER, output=wrong))
    assert d.mismatch and d.runtime is None
    assert d.correctness == "outputs differ: max abs error 0.5, max rel 0.25 (rtol 1e-05, atol 1e-06)"
    shaped = decide.decide(found(SAME, output={**wrong, "max_abs": None, "reason": "shapes (2,) and (3,)"}))
    assert shaped.correctness == "outputs differ: shapes (2,) and (3,)"


def test_agreeing_or_unchecked_outputs_open_no_correctness_regression():
    for output in (AGREE, None):
        d = decide.decide(found(SLOWER, output=output))
        assert d.correctness is None and not d.mismatch


def test_only_a_benchmark_run_opens_regressions():
    wrong = {**AGREE, "max_abs": 1.0, "max_rel": 1.0, "mismatch": True}
    d = decide.decide(found(SLOWER, compile=[(Metric.TIME, SLOWER)], output=wrong, benchmark=False))
    assert (d.runtime, d.compile_time, d.correctness) == (None, None, None)
    assert d.mismatch  # still said: a verify run that sees wrong outputs tells so


# --- the bisection's search ---------------------------------------------------------------


def bisect(n: int, side_of, limit: int = 100, names=("w",)):
    """Run the search over ``n`` commits, ``side_of(name, index)`` standing in for building and
    measuring; each probe counts as one build. Returns (culprits, the probes in order, the end)."""
    search, probes = bisect_search.start(names, n), []
    while (step := bisect_search.next_step(search, len(probes), limit)).probe is not None:
        probe = step.probe
        probes.append(probe.index)
        search = bisect_search.judged(step.search, probe, {name: side_of(name, probe.index) for name in probe.part.names})
    return dict(step.search.culprits), probes, step.search


def first_bad(culprit: int, broken: frozenset[int] = frozenset()):
    return lambda name, i: SKIP if i in broken else (BAD if i >= culprit else GOOD)


def test_the_sides_are_the_stored_step_sides():
    assert {BAD, GOOD, SKIP} == {s.value for s in StepSide}


@pytest.mark.parametrize("n", [2, 3, 7, 8, 16, 33])
def test_every_culprit_is_found_within_the_build_bound(n):
    for culprit in range(n):
        culprits, probes, _ = bisect(n, first_bad(culprit))
        assert culprits == {"w": culprit}, (n, culprit, probes)
        assert len(probes) <= bisect_search.max_builds(n) - 1  # the bad end is built by the verify already
        assert len(set(probes)) == len(probes)  # no commit tested twice


def test_the_middle_is_tested_first_and_the_earlier_of_two_middles():
    _, probes, _ = bisect(8, first_bad(5))
    assert probes == [3, 5, 4]  # range -1..7: middle 3; then 3..7: 5; then 3..5: 4
    _, probes, _ = bisect(9, first_bad(8))
    assert probes[0] == 3  # -1..8: 3 and 4 are as near the middle (3.5); the earlier is tried


def test_a_culprit_at_either_end():
    assert bisect(10, first_bad(0))[0] == {"w": 0}  # the first commit after the good end
    culprits, probes, _ = bisect(10, first_bad(9))  # the bad end itself: every commit before is good
    assert culprits == {"w": 9} and 9 not in probes


def test_a_one_commit_range_names_it_untested():
    culprits, probes, _ = bisect(1, first_bad(0))
    assert culprits == {"w": 0} and probes == []


def test_a_broken_build_is_skipped_and_the_next_nearest_tried():
    culprits, probes, _ = bisect(8, first_bad(6, broken=frozenset({3})))
    assert culprits == {"w": 6}
    assert probes[:2] == [3, 2]  # 3 broken: 2 and 4 are as near the middle, the earlier one first


def test_a_broken_build_just_before_the_culprit_does_not_hide_it():
    culprits, probes, _ = bisect(8, first_bad(5, broken=frozenset({4})))
    assert culprits == {"w": 5} and 4 in probes


def test_a_broken_culprit_blames_the_first_bad_commit_that_builds():
    # the culprit itself does not build: nothing can tell it from its successor, the first known bad
    culprits, _, _ = bisect(8, first_bad(5, broken=frozenset({5})))
    assert culprits == {"w": 6}


def test_when_nothing_can_be_measured_the_bad_end_is_named_after_trying_each_commit_once():
    culprits, probes, _ = bisect(6, lambda name, i: SKIP)
    assert culprits == {"w": 5}
    assert sorted(probes) == [0, 1, 2, 3, 4]


def test_the_build_bound_stops_the_search_without_naming_a_culprit():
    culprits, probes, end = bisect(16, first_bad(11), limit=2)
    assert culprits == {} and end.unresolved == {"w"}
    assert len(probes) == 2
    unbounded, _, _ = bisect(16, first_bad(11))
    assert unbounded == {"w": 11}


def test_workloads_that_disagree_are_searched_apart_each_to_its_culprit():
    culprit_of = {"a": 2, "b": 6}
    culprits, probes, _ = bisect(8, lambda name, i: BAD if i >= culprit_of[name] else GOOD, names=("a", "b"))
    assert culprits == culprit_of
    assert probes[0] == 3  # tested together once, then apart
    assert len(probes) <= 2 * (math.ceil(math.log2(8)) + 1)


def test_the_bad_workloads_are_searched_first_then_the_good_then_the_skipped():
    search = bisect_search.start(("a", "b", "c"), 8)
    step = bisect_search.next_step(search, 0, 10)
    assert step.probe is not None and step.probe.index == 3
    after = bisect_search.judged(step.search, step.probe, {"a": SKIP, "b": GOOD, "c": BAD})
    assert [(set(p.names), p.lo, p.hi, set(p.skipped)) for p in after.todo] == [
        ({"a"}, -1, 7, {3}), ({"b"}, 3, 7, set()), ({"c"}, -1, 3, set())]
    following = bisect_search.next_step(after, 1, 10)
    assert following.probe is not None and following.probe.part.names == {"c"}


def test_the_build_bound_is_ceil_log2_n_plus_one():
    assert [bisect_search.max_builds(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 3, 3, 4, 4, 5, 5, 6]
    for n in range(2, 130):
        assert bisect_search.max_builds(n) == math.ceil(math.log2(n)) + 1


def test_broken_commits_cost_one_build_each_and_one_off_the_middle():
    # Each commit that could not be judged costs its build, and the search goes on off the
    # middle of its range: at most one build more in all (range -1..7, culprit 6, 3 broken:
    # 3 skipped, then 2, 4, 5 and 6 from the side of the middle).
    assert bisect(8, first_bad(6, broken=frozenset({3})))[1] == [3, 2, 4, 5, 6]
    for n in range(2, 13):
        for culprit in range(n):
            for broken in [frozenset(), *(frozenset({i}) for i in range(n)),
                           *(frozenset({i, j}) for i in range(n) for j in range(i + 1, n))]:
                culprits, probes, _ = bisect(n, first_bad(culprit, broken))
                skipped = len(broken & set(probes))
                assert len(probes) <= bisect_search.max_builds(n) - 1 + skipped + (skipped > 0), (n, culprit, broken)
                assert len(set(probes)) == len(probes)
                if culprit not in broken:
                    assert culprits == {"w": culprit}


def test_a_bump_is_searched_into_only_when_its_commits_lead_to_the_new_pin():
    assert bisect_search.into_bump("c", ["a", "b", "c"])
    assert not bisect_search.into_bump("c", [])  # moved back: no commit after the old pin
    assert not bisect_search.into_bump("c", ["a", "b"])  # to a side line: the first parents miss it


# --- one bisection step: the verdicts of its comparisons -> each workload's side --------------


def step_result(name: str, outcome: Outcome, failure: str | None = None) -> WorkloadResult:
    return WorkloadResult(name, verdict(outcome), 0, None, failure)


def compared(run_id: int, *results: WorkloadResult, status: str = "completed") -> CompareOutcome:
    return CompareOutcome(run_id, "bisect", status, [], list(results))


def by_verdict(result: WorkloadResult):
    return result.verdict, result.failure


def judge_step(against_good: CompareOutcome, against_bad: CompareOutcome | None, names=("a", "b")):
    """``bisect._judge`` of commit "x" in good..bad, the comparisons given; returns its sides,
    deciding runs, and the comparisons it asked for."""
    asked = []

    def compare(which, control, treatment):
        asked.append((sorted(which), control, treatment))
        return against_good if (control, treatment) == ("good", "x") else against_bad

    found, deciding, _ = watch_bisect._judge(frozenset(names), "x", "good", "bad", compare, by_verdict)
    return {n: side for n, (side, *_) in found.items()}, deciding, asked


def test_a_step_decided_against_the_good_end_asks_nothing_more():
    sides, deciding, asked = judge_step(compared(1, step_result("a", Outcome.REGRESSION),
                                                 step_result("b", Outcome.SAME)), None)
    assert sides == {"a": BAD, "b": GOOD} and deciding == {"a": 1, "b": 1}
    assert asked == [(["a", "b"], "good", "x")]


def test_an_undecided_step_is_compared_with_the_bad_end_for_the_undecided_only():
    sides, deciding, asked = judge_step(
        compared(1, step_result("a", Outcome.UNKNOWN), step_result("b", Outcome.REGRESSION)),
        compared(2, step_result("a", Outcome.REGRESSION)))  # the bad end slower than x: x is good
    assert asked == [(["a", "b"], "good", "x"), (["a"], "x", "bad")]
    assert sides == {"a": GOOD, "b": BAD} and deciding == {"a": 2, "b": 1}


def test_a_step_neither_end_decides_keeps_the_earlier_commit_as_the_suspect():
    sides, _, _ = judge_step(compared(1, step_result("a", Outcome.UNKNOWN), step_result("b", Outcome.UNKNOWN)),
                             compared(2, step_result("a", Outcome.UNKNOWN)))  # b not even measured there
    assert sides == {"a": BAD, "b": BAD}
    sides, deciding, _ = judge_step(compared(1, step_result("a", Outcome.UNKNOWN)), None, names=("a",))
    assert sides == {"a": BAD} and deciding == {"a": 1}  # no build to compare with the bad end


def test_a_broken_build_or_a_failed_workload_skips_the_step():
    sides, _, asked = judge_step(compared(1, status="build_failed"), None)
    assert sides == {"a": SKIP, "b": SKIP} and len(asked) == 1
    sides, _, _ = judge_step(compared(1, step_result("a", Outcome.SAME, failure="hung"),
                                      step_result("b", Outcome.SAME)), None)
    assert sides == {"a": SKIP, "b": GOOD}


# --- a watched commit's status from its comparison ----------------------------------------


def test_a_compared_commit_is_ok_failed_or_build_failed():
    assert poll.status_of(compared(1, step_result("a", Outcome.REGRESSION))) == (OK, [])
    assert poll.status_of(compared(1, step_result("a", Outcome.SAME, failure="hung"),
                                   step_result("b", Outcome.SAME))) == (FAILED, ["a"])
    assert poll.status_of(compared(1, status="build_failed")) == (BUILD_FAILED, [])
