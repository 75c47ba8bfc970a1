"""Rendering of what ``abwatch`` prints: reports, tables and the ``--json`` shapes.

The command line (``service.cli.main``) parses and dispatches; everything a user reads comes from here,
so a report looks the same whichever command prints it.
"""

from __future__ import annotations

import json
import sys

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from abwatch.service.compare.building import build_failure
from abwatch.service.compare.outcome import CompareOutcome, WorkloadResult
from abwatch.service.stats.verdict import RegressionKind
from abwatch.service.store.models import Regression
from abwatch.service.read.serialize import (  # noqa: F401 - re-exported: commands use report.*_json
    LOG_TAIL_LINES, builds_json, cache_json, compiler_cache_json, decisive_p, history_json, log_tail, outcome_json,
    regression_json, pruned_note, runs_json, short_sha,
)
from abwatch.service.read.build_series import series_json
from abwatch.service.read.stored import StoredRun
from datetime import UTC, datetime

PIPE_WIDTH = 100_000  # no terminal: never cut or wrap a value
WIDE = 120  # from this terminal width on, tables show every column
VERDICT_STYLE = {"regression": "bold red", "improvement": "green", "same": "dim", "unknown": "yellow"}


class RichProgress:
    """Progress on stderr: messages as lines, invocations as one bar per workload."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def message(self, text: str) -> None:
        """Print one line of progress."""
        self.bar.console.print(text, markup=False, highlight=False)

    def invocation(self, workload: str, done: int, total: int) -> None:
        """Advance the workload's bar."""
        if workload not in self.tasks:
            self.tasks[workload] = self.bar.add_task(f"  {workload} (invocations)", total=total)
        self.bar.update(self.tasks[workload], completed=done, total=total)
        if done >= total:
            self.bar.remove_task(self.tasks.pop(workload))


def when(instant: datetime) -> str:
    """An instant as every table shows it: ``2026-11-27 13:55`` under a column whose title
    names the zone (``(UTC)``: stored times are UTC); a line of text adds `` UTC`` itself."""
    return f"{instant:%Y-%m-%d %H:%M}"


def stdout_console() -> Console:
    """The console reports go to: the terminal's width, or when piped no limit at all, so that
    files and CI logs get every value whole."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


def print_outcome(out: Console, stored: StoredRun, as_json: bool, ops: bool = False) -> None:
    """The report of a run (``compare``, ``verify`` and ``show`` print the same): builds (with
    the failed ones' log tails), the verdict table, and the TVM details; ``ops``: the operator
    table of every TVM workload, not only of regressions."""
    if as_json:
        print(json.dumps(outcome_json(stored)))
        return
    outcome = stored.outcome
    for b in outcome.builds:
        note = f" ({b.reused})" if b.reused else " (cached)" if b.cached else ""
        out.print(f"{b.side:9} {short_sha(b.ref)} {short_sha(b.sha)} {b.status}{note}", markup=False)
    for b in outcome.builds:
        if b.build_id in stored.failed_logs:
            tail = log_tail(stored.failed_logs[b.build_id])
            failure = build_failure(stored.failed_logs[b.build_id])
            out.print(f"{b.side} build {b.build_id} failed" + (f": {failure}" if failure else "")
                      + "; the end of its log:", markup=False)
            for line in tail.splitlines() or ["(the build printed nothing)"]:
                out.print(f"  | {line}", markup=False)
            out.print(f"whole log: abwatch builds --log {b.build_id}", markup=False)
    if stored.samples_pruned_at is not None:
        out.print(f"run {outcome.run_id}: {pruned_note(stored.samples_pruned_at)}", markup=False)
    if stored.error and outcome.status == "failed":
        out.print(f"run {outcome.run_id} stopped: {stored.error}", markup=False)
    for m in outcome.build_metrics:  # the builds themselves (binary_size)
        v = m.verdict
        out.print(f"builds: {m.metric.replace('_', ' ')} {v.verdict.value}"
                  + (f" {v.change_pct:+.2f}%" if v.change_pct is not None else "")
                  + (f"; {v.control_median_ms:,.0f} -> {v.treatment_median_ms:,.0f} {v.unit} ({m.source})"
                     if v.control_median_ms is not None and v.treatment_median_ms is not None else "")
                  + (f"; {m.failure}" if m.failure else f" — {v.reason}"), markup=False)
    if outcome.results:
        out.print(verdict_table(outcome, out.width))
        for line in _footnotes(outcome):
            out.print(line, markup=False)
    for r in outcome.results:
        if r.failure:
            out.print(f"{r.workload}: {r.failure}", markup=False)
        else:  # why this verdict, and why the run stopped adding samples there
            stop = f"; stopped: {r.verdict.stop_reason}" if r.verdict.stop_reason else ""
            out.print(f"{r.workload}: {r.verdict.reason}{stop}", markup=False)
        print_instructions(out, r)
        print_tvm_details(out, r, ops)
    out.print(outcome.exit_reason, markup=False)


def verdict_table(outcome: CompareOutcome, width: int) -> Table:
    """One row per workload. Under WIDE columns the medians are left out (they are in
    ``--json``) and the CI is shorter, so the table fits an 80-column terminal whole."""
    wide = width >= WIDE
    table = Table(title=f"run {outcome.run_id} ({outcome.run_type}): {outcome.status}",
                  box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, show_edge=wide,
                  padding=(0, 1), collapse_padding=not wide)
    p_label = "p (BH)" if any(decisive_p(r.verdict)[1] == "BH-adjusted" for r in outcome.results) else "p"
    # the workload's name gets the room it needs first; the regression column folds instead
    longest = max((len(r.workload) for r in outcome.results), default=8)
    table.add_column("workload", overflow="fold", min_width=min(longest, 24 if wide else 16))
    table.add_column("verdict", no_wrap=True, min_width=len("improvement"))
    table.add_column("change", no_wrap=True, justify="right")
    table.add_column("CI", no_wrap=True)
    table.add_column(p_label, no_wrap=True, justify="right")
    if wide:
        table.add_column("control ms", no_wrap=True, justify="right")
        table.add_column("treatment ms", no_wrap=True, justify="right")
    table.add_column("n", no_wrap=True, justify="right")
    table.add_column("regression" if wide else "reg.", overflow="fold")
    for r in outcome.results:
        v = r.verdict
        # `same` is decided by the equivalence interval lying within the threshold, not by p:
        # that interval is the one shown, and no p (a p of 1 beside `same` reads as its proof)
        same = v.verdict.value == "same" and v.same_ci_pct is not None
        p = None if same else decisive_p(v)[0]
        shown = v.same_ci_pct if same else v.ci_pct
        if shown is None:
            ci = "-"
        elif wide:
            ci = f"[{shown[0]:+.2f}, {shown[1]:+.2f}]"
        else:
            ci = f"{shown[0]:+.1f}..{shown[1]:+.1f}"
        row = [r.workload, f"[{VERDICT_STYLE[v.verdict.value]}]{v.verdict.value}[/]",
               "-" if v.change_pct is None else f"{v.change_pct:+.2f}%", ci, "-" if p is None else f"{p:.2g}"]
        if wide:  # the figures the verdict was judged on (a footnote names the estimator)
            figure = "{:,.0f}" if v.unit == "instructions" else "{:.3f}"  # counts, where instructions decided
            row += ["-" if v.control_ms is None else figure.format(v.control_ms),
                    "-" if v.treatment_ms is None else figure.format(v.treatment_ms)]
        n = str(v.control_n) if v.control_n == v.treatment_n else f"{v.control_n}/{v.treatment_n}"
        row += [n, regression_cell(r)]
        table.add_row(*row)
    return table


def print_instructions(out: Console, r: WorkloadResult) -> None:
    """Which metric decided the row, the instructions verdicts (of the run, and of a TVM
    workload's compile) where instructions were counted, and the verdicts of the metrics of the
    timed processes (CPU time, peak memory) where measured."""
    decided = "decided the row" if r.verdict.unit == "instructions" else "beside time, which decided the row"
    compiled = r.compile_instructions
    for label, counted, why in (("instructions", r.instructions, decided),
                                ("compile instructions", compiled, "beside compile time")):
        if not counted:
            continue
        change, ci = counted.get("change_pct"), counted.get("ci_pct")
        line = (f"{r.workload}: {label} ({counted.get('source')}, {why}) {counted['verdict']}"
                + (f" {change:+.3f}%" if isinstance(change, (int, float)) else "")
                + (f" (CI {ci[0]:+.3f}..{ci[1]:+.3f}%)" if ci else ""))
        if counted.get("control_ms") is not None and counted.get("treatment_ms") is not None:
            line += (f"; {counted['control_ms']:,.0f} -> {counted['treatment_ms']:,.0f} instructions, "
                     f"{counted['n'][0]} counted processes a side")
        out.print(line + (f"; {counted['failure']}" if counted.get("failure") else f" — {counted['reason']}"),
                  markup=False)
    for m in r.measured:  # the metrics of the timed processes (CPU time, peak memory)
        v = m.verdict
        line = (f"{r.workload}: {m.metric.replace('_', ' ')} of the {'compile' if m.phase == 'compile-time' else 'run'}"
                f" {v.verdict.value}" + (f" {v.change_pct:+.2f}%" if v.change_pct is not None else "")
                + (f" (CI {v.ci_pct[0]:+.2f}..{v.ci_pct[1]:+.2f}%)" if v.ci_pct else ""))
        if v.control_median_ms is not None and v.treatment_median_ms is not None:
            line += (f"; {v.control_median_ms:,.1f} -> {v.treatment_median_ms:,.1f} {v.unit}, "
                     f"{len(m.control_values)} processes a side")
        out.print(line + (f"; {m.failure}" if m.failure else f" — {v.reason}"), markup=False)


def regression_cell(r) -> str:
    """The regressions a workload's result opened (or, in a verify run, judged): speed and output."""
    cells = [str(r.regression_id)] if r.regression_id is not None else []
    # a compile-time regression, opened by time or by instructions
    for compiled in ((r.details or {}).get("compile") or {}, r.compile_instructions or {}):
        if compiled.get("regression_id") is not None:
            cells.append(f"{compiled['regression_id']} compile")
    if r.correctness_regression_id is not None:
        cells.append(f"{r.correctness_regression_id} output")
    return ", ".join(cells) or "-"


def _footnotes(outcome: CompareOutcome) -> list[str]:
    """What the table's p and samples columns mean, and the p-values it does not show."""
    adjusted = [r for r in outcome.results if decisive_p(r.verdict)[1] == "BH-adjusted"]
    lines = ["n: timing samples per side (control/treatment where they differ); not invocations, each gives several"]
    estimators = sorted({r.verdict.estimator for r in outcome.results if r.verdict.estimator})
    if estimators:
        lines.append("control/treatment ms: what the verdict was judged on: " + "; or ".join(estimators)
                     + " (plain medians: --json)")
    # heavy contention (how a verdict was taken instead of on wall time) is said once, at the
    # start of the workload's own line below the table: its reason begins with it
    if adjusted:
        raw = ", ".join(f"{r.workload} {r.verdict.p_value:.2g}" for r in adjusted)
        lines.append(f"p (BH): Benjamini-Hochberg-adjusted p, which decided the verdict; raw p: {raw}")
    else:
        lines.append("p: the raw p-value, which decided the verdict (no correction applied)")
    same = [r for r in outcome.results if r.verdict.verdict.value == "same" and r.verdict.same_ci_pct is not None]
    if same:
        levels = {round((1 - 2 * r.verdict.equivalence_alpha) * 100) for r in same}
        limits = {r.verdict.threshold_pct for r in same}
        level = f"{levels.pop()} %" if len(levels) == 1 else "its"
        limit = f"+-{limits.pop():g} %" if len(limits) == 1 else "its threshold"
        lines.append(f"same: decided by the {level} equivalence interval (the CI shown) lying within {limit}; "
                     "no p-value decides it")
    return lines


def print_tvm_details(out: Console, r: WorkloadResult, ops: bool = False) -> None:
    """Compile times, the output error, and the operators that explain the change (for a
    regression, or for every TVM workload with ``ops``)."""
    details = r.details
    if details is None:
        return
    compile_ms, error = details["compile_ms"], details["error"]
    # outputs of different shapes have no error figures, only the reason
    measured = (f"output max abs error {error['max_abs']:.3g}, max rel {error['max_rel']:.3g}"
                if error["max_abs"] is not None else error.get("reason") or "outputs not compared")
    judged = details.get("compile")
    # one compile figure: the judged one (fresh compiles, interleaved) where there is one; else
    # the one compile each side's first timed process did, said as what it is
    first = ("" if isinstance(judged, dict) and judged.get("verdict") else
             f"first compile in a timed process {compile_ms['control']:.0f} ms -> {compile_ms['treatment']:.0f} ms "
             "(one a side, not judged); ")
    out.print(f"{r.workload}: {first}{measured}"
              + (" — OUTPUT MISMATCH (correctness regression)" if error["mismatch"] else ""), markup=False)
    if isinstance(judged, dict) and judged.get("verdict"):  # a verdict on compile time, where one was made
        change = judged.get("change_pct")
        ci = judged.get("ci_pct")
        out.print(f"{r.workload}: compile time {judged['verdict']}"
                  + (f" {change:+.2f}%" if isinstance(change, (int, float)) else "")
                  + (f" (CI {ci[0]:+.1f}..{ci[1]:+.1f}%)" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "")
                  + (f"; median {judged['control_median_ms']:.0f} -> {judged['treatment_median_ms']:.0f} ms"
                     f" over {judged['n'][0]} fresh compiles a side" if judged.get("n") and judged.get(
                         "control_median_ms") is not None else "")
                  + (f"; stopped: {judged['stop_reason']}" if judged.get("stop_reason") else ""),
                  markup=False)
    if not details.get("ops") or not (ops or r.verdict.verdict.value == "regression"):
        return
    title = "operators behind the change" if r.verdict.verdict.value == "regression" else "operators"
    # a share of a total change that was not decided (same, unknown) divides by noise: 1398 % of +0.06 %
    decided = r.verdict.verdict.value in ("regression", "improvement")
    table = Table(title=f"{r.workload}: {title}", box=box.SIMPLE_HEAD)
    table.add_column("operator", overflow="fold")
    table.add_column("type", overflow="fold")
    for column in ("control µs", "treatment µs", "change", *(("share",) if decided else ())):
        table.add_column(column, no_wrap=True, justify="right")
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    shown = details["ops"] if ops else details["ops"][:10]
    for op in shown:
        share = (fmt(op["share_pct"], ".0f") + ("%" if op["share_pct"] is not None else ""),) if decided else ()
        table.add_row(op["name"], op.get("features") or op["type"], fmt(op["control_us"], ".1f"),
                      fmt(op["treatment_us"], ".1f"),
                      fmt(op["change_pct"], "+.1f") + ("%" if op["change_pct"] is not None else ""), *share)
    out.print(table)
    out.print("share: the operator's part of the total change" if decided else
              f"no share column: the total change was not decided ({r.verdict.verdict.value}); each operator's "
              "change stands alone", markup=False)


def print_regressions(out: Console, rows: list[Regression], title: str = "regressions") -> None:
    """The regressions table, then each one's state history (a line per change, never squeezed
    into a column); ``title`` "improvements": confirmed improvements, each with its cause."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("id", "workload", "device", "kind", "state", "change"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "kind", "state", "change"))
    for r in rows:
        change = "output" if r.kind == RegressionKind.CORRECTNESS else f"{r.change_pct:+.2f}%"
        table.add_row(str(r.id), r.workload.name, r.device.name if r.device else "-", RegressionKind(r.kind).value, r.state.value,
                      change)
    out.print(table)
    for r in rows:
        culprit = r.culprit_commit
        # the answer to "which commit did it?", once bisection found it
        word, cause = ("improvement", "caused by") if title == "improvements" else ("regression", "culprit")
        named = (f", {cause} {short_sha(culprit.sha)} {culprit.summary or ''} ({culprit.author or 'unknown author'})"
                 if culprit is not None else "")
        out.print(f"{word} {r.id}: {short_sha(r.control_commit.sha)}..{short_sha(r.treatment_commit.sha)}{named}",
                  markup=False)
        if (fixing := r.fixed_by_commit) is not None:  # the watch named the commit that fixed it
            out.print(f"  fixed by {short_sha(fixing.sha)} {fixing.summary or ''}", markup=False)
        if r.culprit_submodule_commit is not None:  # bisected on into the culprit's submodule bump
            out.print(f"  {r.culprit_line}", markup=False)
        for e in r.events:
            out.print(f"  {when(e.at)} UTC {e.from_state.value if e.from_state else '-'}→{e.to_state.value}: "
                      f"{e.reason}", markup=False)


def print_build_regressions(out: Console, rows) -> None:
    """The runs whose builds themselves regressed (their size), a line each: what made them exit 1
    where no workload regressed."""
    if not rows:
        return
    out.print("builds that regressed themselves (no workload did; the run exited 1):", markup=False)
    for run, m in rows:
        change = f" {m.change_pct:+.2f}%" if m.change_pct is not None else ""
        figures = (f" ({m.control_value:,.0f} -> {m.treatment_value:,.0f} {m.unit}, {m.source})"
                   if m.control_value is not None and m.treatment_value is not None else "")
        metric = str(getattr(m.metric, "value", m.metric)).replace("_", " ")
        out.print(f"  run {run.id}: {metric}{change}{figures}; "
                  f"{short_sha(run.control_ref)} → {short_sha(run.treatment_ref)}", markup=False)


def print_runs(out: Console, rows) -> None:
    """The runs, newest first, with their verdict counts."""
    table = Table(title="runs (newest first; `abwatch show ID` for one)", box=box.SIMPLE_HEAD)
    for column in ("id", "type", "status", "started (UTC)", "control → treatment", "verdicts"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "started (UTC)"))
    for r, counts, built in rows:
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "-"
        if built:  # the builds' own metrics (binary size): a regression there makes the run exit 1 too
            verdicts += "; builds: " + ", ".join(f"{m.replace('_', ' ')} {v}" for m, v in sorted(built.items()))
        table.add_row(str(r.id), r.run_type.value, r.status.value, when(r.started_at),
                      f"{short_sha(r.control_ref)} → {short_sha(r.treatment_ref)}", verdicts)
    out.print(table)


def print_builds(out: Console, rows) -> None:
    """The builds, newest first; a failed one with its log's last line."""
    table = Table(title="builds (newest first; `abwatch builds --log ID` for a whole log)", box=box.SIMPLE_HEAD)
    for column in ("id", "commit", "builder", "status", "seconds", "created (UTC)", "compiler cache", "last log line"):
        table.add_column(column, overflow="fold", no_wrap=column in ("id", "commit", "created (UTC)", "seconds"))
    for b in rows:
        last = (b.log or "").rstrip().rsplit("\n", 1)[-1] if b.status.value != "success" else ""
        hits = compiler_cache_json(b.metrics)
        table.add_row(str(b.id), short_sha(b.commit.sha), b.builder, b.status.value,
                      "-" if b.duration_s is None else f"{b.duration_s:.1f}", when(b.created_at),
                      hits["summary"] if hits else "-", last)
    out.print(table)


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """The series as one line of block characters, lowest to highest."""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / span * len(SPARK)))] for v in values)


def print_history(out: Console, workload: str, points, found, skipped: int = 0, unit: str = "ms") -> None:
    """``abwatch history`` in text mode: a sparkline (on a terminal that can draw it), then one
    row per commit, each step change marked at the first commit after it."""
    out.print(f"{workload}: {len(points)} commits, {len(found)} step change(s)"
              + (f"; {skipped} commit(s) off the branch's first-parent line left out (--all-branches)"
                 if skipped else ""), markup=False)
    if out.is_terminal and out.encoding.lower().startswith("utf") and len(points) > 1:
        out.print(f"  {sparkline([p.median_ms for p in points])}", markup=False)
    steps = {s.first_after.sha: s for s in found}
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("commit", no_wrap=True)
    table.add_column("date (UTC)", no_wrap=True)
    table.add_column(f"median {unit}", justify="right", no_wrap=True)
    table.add_column("runs", justify="right", no_wrap=True)
    table.add_column("step", overflow="fold")
    table.add_column("summary", overflow="fold")
    for p in points:
        s = steps.get(p.sha)
        table.add_row(short_sha(p.sha), when(p.committed_at) if p.committed_at else "-",
                      f"{p.median_ms:,.0f}" if unit == "instructions" else f"{p.median_ms:.3f}", str(p.runs),
                      f"◆ {s.change_pct:+.2f}% (p={s.p_value:.2g})" if s else "", p.summary)
    out.print(table)
    out.print("runs: the runs that measured the commit (median of their medians); ◆: a step change "
              "starts at this commit", markup=False)


def print_build_series(out: Console, found, as_json: bool = False) -> int:
    """``abwatch history --metric binary-size``: its JSON, or one table per build configuration,
    a row per commit with its libraries' sizes and the change from the row before; exit 0."""
    if as_json:
        print(json.dumps(series_json(found)))
        return 0
    for s in found:
        table = Table(title=f"{s.builder} {s.config_hash} ({s.repository}): {len(s.points)} builds",
                      box=box.SIMPLE_HEAD)
        for name in ("commit", "date (UTC)", "bytes", "read", "change", "files", "summary"):
            table.add_column(name, justify="right" if name in ("bytes", "change", "files") else "left",
                             overflow="fold", no_wrap=name in ("commit", "date (UTC)", "bytes"))
        before = None
        for p in s.points:
            change = f"{(p.value / before - 1) * 100:+.2f}%" if before else ""
            table.add_row(short_sha(p.sha), when(p.committed_at) if p.committed_at else "-",
                          f"{p.value:,}", p.source, change, str(len(p.files)), p.summary)
            before = p.value
        out.print(table)
    return 0


def print_status(out: Console, found: dict) -> None:
    """``abwatch status``: watched branches (or a line saying none is), then the queue per device."""
    if found["watched"]:
        table = Table(title="watched branches", box=box.SIMPLE_HEAD)
        for column in ("repository", "branch", "device", "last seen", "last tested", "commits"):
            table.add_column(column)
        for w in found["watched"]:
            commits = ", ".join(f"{k} {v}" for k, v in sorted(w["commits"].items()))
            table.add_row(w["repository"], w["branch"], w["device"], short_sha(w["last_seen"] or "-"),
                          short_sha(w["last_tested"] or "-"), commits)
        out.print(table)
    else:  # compare-only use: no empty table
        out.print("no branch is watched (`abwatch watch --config FILE` starts a watch; `abwatch runs` lists "
                  "the comparisons)", markup=False)
    for w in found["watched"]:
        if w["message"]:
            out.print(f"{w['branch']} on {w['device']}: {w['message']}", markup=False)
    for device, states in sorted(found["queue"].items()):
        out.print(f"queue {device}: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())), markup=False)
    for r in found["running"]:
        out.print(f"running job {r['job']} on {r['device']}: {short_sha(r['sha'] or '')} by {r['worker']}",
                  markup=False)
    for j in found.get("try_jobs", []):
        p, result = j["payload"], j["result"] or {}
        runs = ", ".join(f"{k.removesuffix('_id').replace('_', ' ')} {v}" for k, v in result.items()
                         if k.endswith("run_id") and v)
        out.print(f"try job {j['id']} on {j['device']}: {short_sha(p['control'])} -> {short_sha(p['treatment'])} "
                  f"{j['status']}" + (f" ({runs})" if runs else "") + (f": {j['error']}" if j["error"] else ""),
                  markup=False)
    out.print(f"open regressions: {found['open_regressions']}", markup=False)


class LineProgress:
    """Progress as plain lines on stderr (long-running watch and worker logs)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def message(self, text: str) -> None:
        """Print one line, time-stamped."""
        from datetime import datetime
        self.console.print(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {text}", markup=False, highlight=False)

    def invocation(self, workload: str, done: int, total: int) -> None:
        """Invocations are not drawn in a log."""
