"""Everyday commands: show, runs, builds, the report's layout, and the commands' guard rails.

Real git history (the C benchmark), real builds and processes, real databases; rendering tests
build the outcome the report prints and render it with rich at a fixed width.
"""

from __future__ import annotations

import argparse
import io
import json
from datetime import datetime, UTC

import pytest
from rich.console import Console

from abwatch.service import stats
from abwatch.service.cli import report
from abwatch.service.store import db
from abwatch.service.cli import main as cli_module
from abwatch.service.cli.main import main
from abwatch.service.compare.building import BuildOutcome
from abwatch.service.compare.outcome import CompareOutcome, WorkloadResult
from abwatch.service.store.models import Commit, Device, Regression, RegressionEvent, Repository, Workload
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.read.stored import StoredRun


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run the CLI in-process; (exit status, stdout, stderr)."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_show_prints_compare_report_byte_for_byte(capsys, write_config, db_url):
    config = write_config()
    code, compared, _ = cli(capsys, "compare", "--config", config, "--control", "base", "--treatment", "slower",
                            "--db", db_url)
    assert code in (0, 1) and "run 1 (benchmark): completed" in compared
    code, shown, _ = cli(capsys, "show", "1", "--db", db_url)
    assert code == 0 and shown == compared
    code, compared_json, _ = cli(capsys, "compare", "--config", config, "--control", "base",
                                 "--treatment", "noop", "--json", "--db", db_url)
    code, shown_json, _ = cli(capsys, "show", json.loads(compared_json)["run_id"], "--json", "--db", db_url)
    assert shown_json == compared_json
    payload = json.loads(shown_json)
    result = payload["results"][0]
    # the p that decided is named, the other is there too
    assert result["p_decisive"] == "p_adjusted" and result["p_value"] is not None
    assert result["n_counts"] == "samples"
    assert [b["cached"] for b in payload["builds"]] == [True, False]

    code, listed, _ = cli(capsys, "runs", "--json", "--db", db_url)
    runs = json.loads(listed)
    assert [r["id"] for r in runs] == [2, 1]
    assert runs[1]["verdicts"] == {"regression": 1} and runs[1]["treatment_ref"] == "slower"
    code, limited, _ = cli(capsys, "runs", "--limit", "1", "--db", db_url)
    assert code == 0 and "base → noop" in limited and "base → slower" not in limited


def test_show_of_an_unknown_run_is_a_clear_error(capsys, sqlite_url):
    assert cli(capsys, "db", "upgrade", "--db", sqlite_url)[0] == 0
    code, _, err = cli(capsys, "show", "42", "--db", sqlite_url)
    assert code == 2 and "run 42 does not exist" in err


def test_failed_build_prints_the_end_of_its_log(capsys, write_config, sqlite_url):
    config = write_config()
    broken = config.parent / "broken.toml"
    broken.write_text(config.read_text().replace(
        'command = ["sh", "build.sh"]',
        'command = ["sh", "-c", "for i in $(seq 1 40); do echo compiling unit $i; done; '
        'echo \\"bench.c:3:1: error: expected identifier\\" >&2; exit 1"]'))
    code, out, _ = cli(capsys, "compare", "--config", broken, "--control", "base", "--treatment", "slower",
                       "--db", sqlite_url)
    assert code == 3
    assert "bench.c:3:1: error: expected identifier" in out
    assert "compiling unit 40" in out and "compiling unit 2\n" not in out  # the tail, not the whole log
    assert "whole log: abwatch builds --log 1" in out
    assert cli(capsys, "show", "1", "--db", sqlite_url)[1] == out

    code, listed, _ = cli(capsys, "builds", "--failed", "--json", "--db", sqlite_url)
    builds = json.loads(listed)
    assert code == 0 and builds and all(b["status"] == "build_failed" for b in builds)
    assert "expected identifier" in builds[0]["log_tail"]
    code, log, _ = cli(capsys, "builds", "--log", builds[0]["id"], "--db", sqlite_url)
    assert code == 0 and "compiling unit 2\n" in log and "expected identifier" in log
    code, _, err = cli(capsys, "builds", "--log", "999", "--db", sqlite_url)
    assert code == 2 and "build 999 does not exist" in err


def _verdict(kind: str, change: float, ci: tuple[float, float], p: float, p_adj: float) -> stats.Verdict:
    return stats.Verdict(stats.Outcome(kind), change, ci, p, 480, 480, 12.3456, 12.3456 * (1 + change / 100),
                         1.0, 0.01, 0.99, f"{kind} because", p_adjusted=p_adj, correction="benjamini-hochberg",
                         stop_reason="decided at look 2 of 5", control_ms=12.3456,
                         treatment_ms=12.3456 * (1 + change / 100), estimator="fastest sample per process")


def _outcome() -> StoredRun:
    results = [
        WorkloadResult("resnet18-batch1-llvm", _verdict("unknown", -4.21, (-12.34, 16.72), 0.27, 0.67), 1, None, None),
        WorkloadResult("transformer-block", _verdict("improvement", -11.5, (-13.01, -9.99), 0.001, 0.002), 2,
                       None, None, None,
                       {"compile_ms": {"control": 500.0, "treatment": 490.0}, "workers": {},
                        "error": {"max_abs": 0.0, "max_rel": 0.0, "mismatch": False},
                        "ops": [{"name": "fused_softmax", "type": "softmax", "control_us": 50.0,
                                 "treatment_us": 40.0, "change_pct": -20.0, "share_pct": 100.0}]}),
        WorkloadResult("mlp", _verdict("regression", 13.25, (10.5, 16.25), 1e-5, 3e-5), 3, 7, None, 8,
                       {"compile_ms": {"control": 900.0, "treatment": 950.0}, "workers": {},
                        "compile": {"verdict": "regression", "change_pct": 5.5, "ci_pct": [2.0, 9.0]},
                        "error": {"max_abs": 0.5, "max_rel": 0.25, "mismatch": True},
                        "ops": [{"name": "fused_matmul_add_relu_with_a_very_long_name", "type": "matmul",
                                 "control_us": 100.0, "treatment_us": 120.0, "change_pct": 20.0, "share_pct": 90.0}]}),
    ]
    builds = [BuildOutcome("control", "0.26.0", "0.26.0", "success", True, 1),
              BuildOutcome("treatment", "0.27.0.post1", "0.27.0.post1", "success", False, 2)]
    return StoredRun(CompareOutcome(5, "benchmark", "completed", builds, results), "0.26.0", "0.27.0.post1",
                     None, None, None, None)


def _render(width: int, **options) -> str:
    out = Console(width=width, file=io.StringIO(), highlight=False, color_system=None)
    report.print_outcome(out, _outcome(), False, **options)
    return out.file.getvalue()


def test_report_fits_80_columns_without_cutting_values():
    text = _render(80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for whole in ("unknown", "improvement", "regression", "-12.3..+16.7", "0.27.0.post1", "7, 8 output"):
        assert whole in text, whole
    assert "resnet18-batch1-" in text  # a long workload name folds onto a second line, nothing is cut
    wide = _render(200)
    assert "[-12.34, +16.72]" in wide and "control ms" in wide and "12.346" in wide
    assert "judged on: fastest sample per process" in " ".join(wide.split())


def test_report_labels_the_p_that_decided_and_shows_the_other():
    text = _render(80)
    assert "p (BH)" in text
    row = next(line for line in text.splitlines() if "unknown" in line)
    assert "0.67" in row and "0.27" not in row  # the table shows the BH-adjusted p, which decided
    assert "raw p: resnet18-batch1-llvm 0.27" in " ".join(text.split())


def test_report_says_why_each_verdict_and_why_it_stopped():
    text = " ".join(_render(80).split())
    assert "transformer-block: improvement because; stopped: decided at look 2 of 5" in text
    assert "mlp: compile time regression +5.50% (CI +2.0..+9.0%)" in text


def test_correctness_regressions_show_in_the_run_table():
    text = _render(80)
    row = next(line for line in text.splitlines() if line.strip().startswith("mlp"))
    assert row.rstrip().endswith("7, 8 output")
    assert "OUTPUT MISMATCH" in " ".join(text.split())


def test_ops_tables_for_every_tvm_workload_only_when_asked():
    plain, with_ops = _render(200), _render(200, ops=True)
    # a regression's operator table is always there; --ops adds the improvement's
    assert "mlp: operators behind the change" in plain and "fused_matmul_add_relu_with_a_very_long_name" in plain
    assert "fused_softmax" not in plain
    assert "transformer-block: operators" in with_ops and "fused_softmax" in with_ops


def test_regressions_table_for_a_correctness_regression_keeps_refs_whole():
    at = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    regression = Regression(
        id=4, kind="correctness", state=RegressionState.BENCHMARK, change_pct=0.0,
        workload=Workload(name="mlp"), control_commit=Commit(sha="0.26.0"),
        treatment_commit=Commit(sha="0.27.0.post1"),
        events=[RegressionEvent(from_state=None, to_state=RegressionState.BENCHMARK, at=at,
                                reason="benchmark run 3: outputs differ: max abs error 0.5, max rel 0.25")])
    out = Console(width=80, file=io.StringIO(), highlight=False, color_system=None)
    report.print_regressions(out, [regression])
    text = out.file.getvalue()
    assert "0.26.0..0.27.0.post1" in text and "output" in text and "+0.00%" not in text
    assert "outputs differ: max abs error 0.5" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80


def test_regressions_name_device_culprit_and_a_masked_repository():
    at = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    culprit = Commit(sha="c" * 40, summary="Slow down the matmul schedule", author="Ada")
    regression = Regression(
        id=7, kind="runtime", state=RegressionState.REGRESS, change_pct=6.25,
        workload=Workload(name="resnet18", repository=Repository(url="https://bot:s3cret@example.org/tvm.git")),
        device=Device(name="rk3399-board"), control_commit=Commit(sha="a" * 40), treatment_commit=Commit(sha="b" * 40),
        culprit_commit=culprit, bisection=[], events=[
            RegressionEvent(from_state=RegressionState.VERIFY, to_state=RegressionState.REGRESS, at=at,
                            reason="verify run 9: slower by 6.25%")])
    out = Console(width=100, file=io.StringIO(), highlight=False, color_system=None)
    report.print_regressions(out, [regression])
    text = " ".join(out.file.getvalue().split())
    assert "rk3399-board" in text and "+6.25%" in text
    assert "regression 7: aaaaaaaaaaaa..bbbbbbbbbbbb, culprit cccccccccccc Slow down the matmul schedule (Ada)" in text
    data = regression.to_dict()  # the shape of `regressions --json` (beside its explanation)
    assert data["device"] == "rk3399-board" and data["culprit"]["sha"] == "c" * 40
    assert "s3cret" not in data["repository"] and data["repository"].endswith("example.org/tvm.git")


def _actions(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {where}", a) for where, a in _actions(sub))
        else:
            yield "", action


def test_version_and_help_texts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("abwatch ")
    missing = [f"{where}{a.option_strings or a.dest}" for where, a in _actions(cli_module._parser())
               if not a.help]
    assert missing == []
    with pytest.raises(SystemExit):
        main(["history", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-pvalue MAX_PVALUE largest p-value" in text and "--json print one JSON object" in text


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_db_downgrade_refuses_without_a_revision_and_base_needs_yes(capsys, sqlite_url):
    assert cli(capsys, "db", "upgrade", "--db", sqlite_url)[0] == 0
    code, _, err = cli(capsys, "db", "downgrade", "--db", sqlite_url)
    assert code == 2 and "needs --revision" in err
    code, _, err = cli(capsys, "db", "downgrade", "--revision", "base", "--db", sqlite_url)
    assert code == 2 and "--yes" in err
    assert db.current_revision(db.make_engine(sqlite_url)) == db.head_revision(sqlite_url)  # nothing dropped
    code, out, _ = cli(capsys, "db", "downgrade", "--revision", "base", "--yes", "--db", sqlite_url)
    assert code == 0 and "(empty)" in out
    code, _, err = cli(capsys, "runs", "--db", sqlite_url)
    assert code == 2 and "abwatch db upgrade" in err
    assert cli(capsys, "db", "upgrade", "--db", sqlite_url)[0] == 0
    assert cli(capsys, "runs", "--db", sqlite_url)[0] == 0


def test_piped_cache_listing_keeps_keys_whole(capsys, write_config, sqlite_url):
    config = write_config()
    assert cli(capsys, "compare", "--config", config, "--control", "base", "--treatment", "noop",
               "--json", "--db", sqlite_url)[0] in (0, 1)
    code, listed, _ = cli(capsys, "cache", "--config", config, "--json")
    keys = [e["key"] for e in json.loads(listed)["entries"]]
    code, table, _ = cli(capsys, "cache", "--config", config)
    assert code == 0 and keys and all(key in table for key in keys)


def test_history_keeps_to_the_branch_first_parent_line(capsys, write_config, sqlite_url, tmp_path, bench_repo):
    """A commit measured on another branch is left out unless --all-branches asks for it."""
    import git

    from abwatch.service.cli.demo import make_demo_repo
    from conftest import HISTORY

    path = tmp_path / "repo"
    make_demo_repo(path, HISTORY[:2])  # base, noop on main
    repo = git.Repo(path)
    repo.git.checkout("-b", "side", "base")
    (path / "README.md").write_text("# side branch\n")
    repo.index.add(["README.md"])
    repo.index.commit("Work on a side branch")
    repo.create_tag("side-tip")
    repo.git.checkout("main")
    config = write_config(repetitions=4)
    config.write_text(config.read_text().replace(json.dumps(str(bench_repo)), json.dumps(str(path))))
    for treatment in ("noop", "side-tip"):
        assert cli(capsys, "compare", "--config", config, "--control", "base", "--treatment", treatment,
                   "--json", "--db", sqlite_url)[0] in (0, 1)
    side_sha = repo.commit("side-tip").hexsha
    code, out, _ = cli(capsys, "history", "loop", "--json", "--db", sqlite_url)
    payload = json.loads(out)
    assert code == 0 and [p["sha"] for p in payload["series"]] == [repo.commit("base").hexsha,
                                                                    repo.commit("noop").hexsha]
    assert payload["left_out"] == 1
    code, out, _ = cli(capsys, "history", "loop", "--all-branches", "--json", "--db", sqlite_url)
    assert side_sha in [p["sha"] for p in json.loads(out)["series"]]
    code, text, _ = cli(capsys, "history", "loop", "--db", sqlite_url)
    assert code == 0 and "loop: 2 commits" in text and "1 commit(s) off the branch" in text
    assert repo.commit("noop").hexsha[:12] in text and side_sha[:12] not in text
    assert "▁" not in text  # no sparkline when the output is not a terminal


def test_history_table_marks_the_step_and_draws_a_sparkline_on_a_terminal():
    from abwatch.service.read.history import Point, Step

    at = datetime(2026, 1, 1, tzinfo=UTC)
    points = [Point(f"{i:040x}", f"commit {i}", at, 10.0 if i < 5 else 11.0, 1) for i in range(10)]
    step = Step(points[4], points[5], 10.0, 1e-6)
    out = Console(width=80, file=io.StringIO(), force_terminal=True, color_system=None, highlight=False)
    report.print_history(out, "mlp", points, [step])
    text = out.file.getvalue()
    assert "mlp: 10 commits, 1 step change(s)" in text
    assert "▁▁▁▁▁█████" in text
    marked = [line for line in text.splitlines() if "◆" in line and "+10.00%" in line]
    assert len(marked) == 1 and points[5].sha[:12] in marked[0]
    assert max(len(line) for line in text.splitlines()) <= 80


def test_heavy_contention_is_said_once_per_workload():
    from dataclasses import replace

    caveat = "heavy contention: the processes ran 22% of their wall time on a CPU: judged on CPU time per process"
    stored = _outcome()
    first = stored.outcome.results[0]
    judged = replace(first.verdict, caveat=caveat, reason=f"{caveat}; {first.verdict.reason}")
    outcome = replace(stored.outcome, results=[replace(first, verdict=judged), *stored.outcome.results[1:]])
    out = Console(width=200, file=io.StringIO(), highlight=False, color_system=None)
    report.print_outcome(out, replace(stored, outcome=outcome), False)
    text = out.file.getvalue()
    assert text.count("heavy contention") == 1, text
    assert f"resnet18-batch1-llvm: {caveat}; unknown because" in text
