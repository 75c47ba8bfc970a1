"""What a new user sees first from the commands that only read: no empty tables, no files made."""

from __future__ import annotations

from abwatch.service.cli.main import main


def test_status_without_a_watch_says_so_instead_of_an_empty_table(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'abwatch.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    capsys.readouterr()
    assert main(["status", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "no branch is watched" in out and "watched branches" not in out
    assert "open regressions: 0" in out


def _tvm_result(verdict):
    """A TVM workload's result as the driver returns it, with an operator table whose shares are
    big only because the total change is small."""
    from abwatch.service.compare.attribution import op_table
    from abwatch.service.compare.outcome import WorkloadResult

    control = [{"ops": {"fused_matmul_add": 100.0, "fused_relu": 50.0}}]
    treatment = [{"ops": {"fused_matmul_add": 107.0, "fused_relu": 43.1}}]
    details = {"compile_ms": {"control": 150.0, "treatment": 149.0}, "ops": op_table(control, treatment),
               "op_features": {}, "error": {"max_abs": 0.0, "max_rel": 0.0, "mismatch": False}, "workers": {}}
    return WorkloadResult(workload="mlp", verdict=verdict, comparison_id=1, regression_id=None, failure=None,
                          details=details)


def test_operator_shares_are_shown_only_where_the_total_change_was_decided():
    from rich.console import Console

    from abwatch.service.cli.report import print_tvm_details
    from abwatch.service.stats.exact import compare_exact

    undecided = _tvm_result(compare_exact(150.0, 150.1, threshold_pct=1.0, unit="ms"))
    assert undecided.details["ops"][0]["share_pct"] > 1000  # what would be printed: 7 us of a 0.1 us change
    console = Console(record=True, width=200)
    print_tvm_details(console, undecided, ops=True)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "control µs" in line)
    assert "share" not in header and "+7.0%" in text and "-13.8%" in text  # each operator's own change kept
    assert "no share column: the total change was not decided (same)" in text

    decided = _tvm_result(compare_exact(150.0, 165.0, threshold_pct=1.0, unit="ms"))
    console = Console(record=True, width=200)
    print_tvm_details(console, decided, ops=True)
    assert "share: the operator's part of the total change" in console.export_text()


def test_a_workload_shows_one_compile_figure_and_says_which():
    from rich.console import Console

    from abwatch.service.cli.report import print_tvm_details
    from abwatch.service.stats.exact import compare_exact

    result = _tvm_result(compare_exact(150.0, 150.1, threshold_pct=1.0, unit="ms"))
    console = Console(record=True, width=200)
    print_tvm_details(console, result)
    assert "first compile in a timed process 150 ms -> 149 ms (one a side, not judged)" in console.export_text()
    # with a verdict on fresh compiles, that verdict's figures are the only ones
    judged = {"verdict": "improvement", "change_pct": -56.4, "ci_pct": [-60.0, -52.0], "control_median_ms": 179.0,
              "treatment_median_ms": 78.0, "n": [8, 8]}
    result.details["compile"] = judged
    console = Console(record=True, width=200)
    print_tvm_details(console, result)
    text = console.export_text()
    assert "first compile" not in text and "150 ms" not in text
    assert "compile time improvement -56.40% (CI -60.0..-52.0%); median 179 -> 78 ms over 8 fresh compiles" in text


def test_same_shows_the_interval_that_decided_it_and_no_p():
    from dataclasses import replace

    from rich.console import Console

    from abwatch.service.cli.report import _footnotes, verdict_table
    from abwatch.service.compare.outcome import CompareOutcome
    from abwatch.service.stats.exact import compare_exact

    base = compare_exact(150.0, 150.1, threshold_pct=1.0, unit="ms")
    # a `same` as the sequential rule returns it: a 99 % CI past +-1 %, its 90 % interval within
    same = replace(base, ci_pct=(-1.4, 1.2), same_ci_pct=(-0.8, 0.7), p_value=1.0)
    result = replace(_tvm_result(same), details=None)
    outcome = CompareOutcome(1, "benchmark", "completed", [], [result])
    console = Console(record=True, width=200)
    console.print(verdict_table(outcome, 200))
    row = next(line for line in console.export_text().splitlines() if "mlp" in line)
    assert "[-0.80, +0.70]" in row and "-1.40" not in row
    assert "1" not in row.split("+0.70]")[1].split()[0]  # the p column holds no p
    notes = _footnotes(outcome)
    assert "same: decided by the 90 % equivalence interval (the CI shown) lying within +-1 %; " \
           "no p-value decides it" in notes
