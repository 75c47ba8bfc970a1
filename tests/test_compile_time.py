"""service.compare.compile_time's pure parts: the stored ``compile`` object and its verdict, and the
Benjamini-Hochberg family of a run's compile verdicts (the measuring loop runs real TVM
compiles in tests/test_tvm.py)."""

from __future__ import annotations

import numpy as np

from abwatch.service import stats
from abwatch.service.compare import compile_time


def _judged(change: float, seed: int) -> compile_time.CompileJudged:
    rng = np.random.default_rng(seed)
    control = list(200 * rng.lognormal(0, 0.02, 10))
    treatment = list(200 * (1 + change) * rng.lognormal(0, 0.02, 10))
    look = stats.sequential_look(control, treatment, list(range(10)), list(range(10)), look=2, elapsed_s=30.0,
                                 budget=stats.Budget(max_seconds=100, max_pairs=10))
    return compile_time.CompileJudged(look.verdict, {"control": control, "treatment": treatment})


def test_details_hold_the_verdict_and_the_compile_times():
    judged = _judged(-0.5, 1)
    d = compile_time.details(judged)
    assert d["verdict"] == "improvement" and d["change_pct"] < -40 and d["ci_pct"][1] < 0
    assert d["n"] == [10, 10] and d["control_ms"] == judged.samples["control"]
    assert d["stop_reason"] == "decided at look 2, 10 pairs, 30.0s" and d["elapsed_s"] == 30.0
    again = compile_time.verdict_of({"compile": d})  # what verify judges a compile-time regression by
    assert again.verdict == stats.Outcome.IMPROVEMENT and again.change_pct == d["change_pct"]
    assert tuple(d["ci_pct"]) == again.ci_pct


def test_no_compile_object_is_an_unknown_verdict():
    assert compile_time.verdict_of({}).verdict == stats.Outcome.UNKNOWN
    failed = {"compile": {"verdict": "unknown", "failure": "control compile 0 error: boom"}}
    assert "boom" in compile_time.verdict_of(failed).reason


def test_compile_verdicts_are_one_fdr_family_and_absent_ones_pass_through():
    judged = [_judged(0.4, 2), None, _judged(0.0, 3)]
    adjusted = compile_time.adjust(judged)
    assert adjusted[1] is None
    assert [j.verdict.correction for j in (adjusted[0], adjusted[2])] == ["benjamini-hochberg"] * 2
    assert adjusted[0].verdict.p_adjusted >= judged[0].verdict.p_value
