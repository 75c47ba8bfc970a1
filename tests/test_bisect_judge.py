"""The bisection engine judges each step with the verdict its regression's kind names
(:data:`service.watch.bisect.JUDGES`): run time for ``runtime``, the comparison's ``compile`` details for
``compile-time``. Here the engine runs on a real git history (the C benchmark, real builds and
processes, SQLite) with a judge given to it; the compile-time judge itself is checked on the
details a comparison stores. (The whole path with real TVM compiles takes minutes a comparison
on a busy 2-core machine, too long for the suite.)
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service import stats
from abwatch.service.compare import compile_time, instructions, driver, lifecycle, outcome
from abwatch.service.store import db
from abwatch.service.watch import bisect, poll as watch
from abwatch.service.config import load_config
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import BisectionStep, Comparison, Run
from abwatch.service.stats.verdict import Metric

from tests.test_watch import shas, step, write_watch_config

FLIP = {stats.Outcome.IMPROVEMENT: stats.Outcome.REGRESSION, stats.Outcome.REGRESSION: stats.Outcome.IMPROVEMENT}


def faster_is_worse(result: outcome.WorkloadResult) -> tuple[stats.Verdict, str | None]:
    """A judge for a quantity where less time is worse (as a throughput drop would be read)."""
    v = result.verdict
    return replace(v, verdict=FLIP.get(v.verdict, v.verdict)), result.failure


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_each_step_is_judged_by_the_judge_given(tmp_path, sqlite_url):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"), step("n1", "README", note="n1"),
                          step("fast", "Do 25% less work", 0.75), step("n2", "README", 0.75, note="n2")))
    tags = shas(repo)
    config = load_config(write_watch_config(tmp_path, repo, ""))
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with Session(engine, expire_on_commit=False) as session:
        outcome = driver.run_compare(session, config, tags["base"], tags["n2"])
        assert outcome.results[0].verdict.verdict == stats.Outcome.IMPROVEMENT  # run time: faster
        run = session.get(Run, outcome.run_id)
        comparison = session.get(Comparison, outcome.results[0].comparison_id)
        # what the faster-is-worse judge calls a regression of the range, opened as the lifecycle does
        regression = lifecycle.open_regression(session, run, comparison, kind="runtime", reason="test")
        other = lifecycle.open_regression(session, run, comparison, kind="compile-time", reason="test")
        session.commit()
        with pytest.raises(ValueError, match="cannot bisect regressions of kinds"):  # each kind its own judge
            bisect.find_culprit(session, config, watch.mirror_of(config), [regression, other], run.id)
        culprits = bisect.find_culprit(session, config, watch.mirror_of(config), [regression], run.id,
                                       judge=faster_is_worse)
        assert culprits == {"loop": tags["fast"]}
        assert regression.culprit_commit.sha == tags["fast"] and regression.group_id == regression.id
        steps = {s.commit.sha: s for s in session.scalars(
            select(BisectionStep).where(BisectionStep.regression_id == regression.id))}
        # the judge's reading, not the run time's, is stored: a regression on the bad side where it ran faster
        fast = steps[tags["fast"]]
        assert (fast.verdict.value, fast.side.value) == ("regression", "bad") and fast.change_pct < -15
        assert all(s.side.value == "good" for sha, s in steps.items() if sha != tags["fast"])
        assert tags["n2"] not in steps  # the bad end is never tried
    engine.dispose()


def test_the_kind_and_the_metric_pick_the_judge():
    # every (kind, metric) reads its verdict through the metric registry: time's run verdict is the
    # result's own, its compile verdict the compile's; instructions the counts of the run or compile
    assert set(bisect.JUDGES) == {(kind, metric) for kind in ("runtime", "compile-time") for metric in Metric}
    assert set(bisect.BISECTED_KINDS) == {"compile-time", "runtime"}
    # the compile judge reads the compile's counts, not the run's
    slower = stats.compare([100.0] * 6, [110.0] * 6, control_groups=range(6), treatment_groups=range(6))
    same = stats.compare([100.0] * 6, [100.0] * 6, control_groups=range(6), treatment_groups=range(6))
    counted = instructions.CountJudged(slower, {"control": [100.0] * 6, "treatment": [110.0] * 6}, "valgrind")
    result = outcome.WorkloadResult("mlp", same, 1, None, None, compile_instructions=instructions.details(counted))
    verdict, not_judged = bisect.JUDGES[("compile-time", "instructions")](result)
    assert not_judged is None and verdict.verdict == stats.Outcome.REGRESSION and verdict.change_pct == pytest.approx(10)
    verdict, not_judged = bisect.JUDGES[("runtime", "instructions")](result)
    assert not_judged == "instructions not counted"
    # a wrong output has no "slower" to bisect on
    assert "correctness" not in {kind for kind, _ in bisect.JUDGES} and "correctness" not in bisect.BISECTED_KINDS


def _judged(control: list[float], treatment: list[float]) -> compile_time.CompileJudged:
    verdict = stats.compare(control, treatment, threshold_pct=1.0, seed=1)
    return compile_time.CompileJudged(verdict, {"control": control, "treatment": treatment})


def test_the_compile_judge_reads_the_compile_verdict_not_the_run_time():
    rng = random.Random(4)
    control = [400 + rng.random() * 8 for _ in range(12)]
    slower = [600 + rng.random() * 8 for _ in range(12)]
    same_run_time = replace(stats.compare([1.0] * 12, [1.0] * 12), verdict=stats.Outcome.SAME)
    details = {"compile": compile_time.details(_judged(control, slower))}
    result = outcome.WorkloadResult("mlp", same_run_time, 1, None, None, details=details)  # type: ignore[arg-type]
    verdict, failure = compile_time.judged(result)
    assert failure is None and verdict.verdict == stats.Outcome.REGRESSION and verdict.change_pct > 40
    assert bisect.JUDGES[("runtime", "time")](result)[0].verdict == stats.Outcome.SAME
    assert bisect.JUDGES[("compile-time", "time")](result) == compile_time.judged(result)
    # no compiles (not a TVM workload, or compile_repetitions = 0): a step it cannot judge
    bare = replace(result, details=None)
    assert compile_time.judged(bare)[1] == "compile time not measured"
    # the compiles failed, or the run did: skipped like a commit that does not build
    broken = {"compile": {**details["compile"], "failure": "treatment compile 3 error: boom"}}
    assert compile_time.judged(replace(result, details=broken))[1] == "treatment compile 3 error: boom"
    assert compile_time.judged(replace(result, failure="hung"))[1] == "hung"


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_compile_improvement_checks_a_compile_time_regression_not_a_runtime_one(tmp_path, sqlite_url):
    """`fixed` reads the verdict of the regression's kind: a later run whose compiles are
    faster again makes the open compile-time regression's measured check run; its run time,
    the same, leaves the runtime regression alone. (A command workload has no compiles, so the
    check cannot judge one: the regression stays open, with a note saying so.)"""
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"), step("n1", "README", note="n1")))
    tags = shas(repo)
    config = load_config(write_watch_config(tmp_path, repo, ""))
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with Session(engine, expire_on_commit=False) as session:
        outcome = driver.run_compare(session, config, tags["base"], tags["n1"])
        run = session.get_one(Run, outcome.run_id)
        comparison = session.get_one(Comparison, outcome.results[0].comparison_id)
        opened = {kind: lifecycle.open_regression(session, run, comparison, kind=kind, reason="test")
                  for kind in ("runtime", "compile-time")}
        for regression in opened.values():
            regression.change_pct = 30.0
            lifecycle.transition(session, regression, lifecycle.S.VERIFY, run, "test")
            lifecycle.transition(session, regression, lifecycle.S.REGRESS, run, "test")
        session.commit()
        rng = random.Random(5)
        faster = _judged([600 + rng.random() * 8 for _ in range(12)], [400 + rng.random() * 8 for _ in range(12)])
        assert faster.verdict.verdict == stats.Outcome.IMPROVEMENT
        same_run_time = replace(outcome.results[0].verdict, verdict=stats.Outcome.SAME)
        result = replace(outcome.results[0], verdict=same_run_time,
                         details={"compile": compile_time.details(faster)})
        fixed = watch._fixes(session, config, replace(outcome, results=[result]))
        session.commit()
        assert fixed == []
        assert opened["compile-time"].state == opened["runtime"].state == lifecycle.S.REGRESS
        notes = {kind: [e.reason for e in r.events if e.from_state == e.to_state] for kind, r in opened.items()}
        assert notes["runtime"] == [] and len(notes["compile-time"]) == 1
        assert "against the good commit" in notes["compile-time"][0] and "could not judge" in notes["compile-time"][0]
    engine.dispose()


def test_a_compile_regression_on_time_or_instructions_makes_compare_exit_1():
    rng = random.Random(5)
    control = [400 + rng.random() * 8 for _ in range(12)]
    same_run_time = replace(stats.compare([1.0] * 12, [1.0] * 12), verdict=stats.Outcome.SAME)
    on_time = {"compile": compile_time.details(_judged(control, [600 + rng.random() * 8 for _ in range(12)]))}
    unchanged = {"compile": compile_time.details(_judged(control, control))}
    slower = stats.compare([100.0] * 6, [110.0] * 6, control_groups=range(6), treatment_groups=range(6))
    counted = instructions.details(instructions.CountJudged(slower, {"control": [100.0] * 6, "treatment": [110.0] * 6},
                                                            "valgrind"))

    def exit_code(**result) -> int:
        run = outcome.CompareOutcome(1, "benchmark", "completed", [],
                                     [outcome.WorkloadResult("mlp", same_run_time, 1, None, None, **result)])
        return run.exit_code

    assert exit_code(details=unchanged) == 0
    assert exit_code(details=on_time) == 1
    assert exit_code(details=unchanged, compile_instructions=counted) == 1
    assert exit_code(instructions=counted) == 1
