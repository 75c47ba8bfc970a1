"""The ``abwatch`` command line.

Exit status: 0 no regression, 1 at least one regression, 2 usage or config error,
3 a build failed. Reports go to stdout; progress goes to stderr so ``--json`` stays clean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import select

from service import db, driver, history
from service.config import ConfigError, load_config
from service.driver import EXIT_USAGE, CompareOutcome
from service.models import Regression, RegressionState
from service.records import RecordError, export_records, import_records
from runners import RunnerUnavailable
from service.repo import RepoError

VERDICT_STYLE = {"regression": "bold red", "improvement": "green", "same": "dim", "unknown": "yellow"}


class RichProgress:
    """Progress on stderr: messages as lines, invocations as one bar per workload."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True)
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> "RichProgress":
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
            self.tasks[workload] = self.bar.add_task(f"  {workload}", total=total)
        self.bar.update(self.tasks[workload], completed=done, total=total)
        if done >= total:
            self.bar.remove_task(self.tasks.pop(workload))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abwatch", description="A/B performance-regression watch")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_db(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--db", help=f"database URL (default: ${db.ENV_DATABASE_URL} or {db.DEFAULT_DATABASE_URL})")
        return p

    p = with_db(sub.add_parser("compare", help="A/B-compare two refs of the configured repository"))
    p.add_argument("--config", required=True, type=Path, help="TOML config file")
    p.add_argument("--control", required=True, help="baseline ref (branch, tag or sha)")
    p.add_argument("--treatment", required=True, help="ref under test")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    p = with_db(sub.add_parser("verify", help="re-run a benchmark run's suspected regressions"))
    p.add_argument("run_id", type=int)
    p.add_argument("--json", action="store_true")

    p = with_db(sub.add_parser("regressions", help="list regressions and their state changes"))
    p.add_argument("--state", choices=[s.value for s in RegressionState])
    p.add_argument("--json", action="store_true")

    p = with_db(sub.add_parser("history", help="a workload's per-commit series and its step changes"))
    p.add_argument("workload")
    p.add_argument("--device", help="device (record 'hardware') to restrict to")
    p.add_argument("--max-pvalue", type=float, default=0.001)
    p.add_argument("--json", action="store_true")

    records = sub.add_parser("records", help="TVM benchmark records (schema v0.1)")
    rsub = records.add_subparsers(dest="records_command", required=True)
    p = with_db(rsub.add_parser("export", help="write stored records"))
    p.add_argument("--format", choices=["jsonl"], default="jsonl")
    p.add_argument("--run", type=int, dest="run_id")
    p.add_argument("--workload")
    p.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    p = with_db(rsub.add_parser("import", help="validate and store records (all or nothing)"))
    p.add_argument("file", type=Path)

    dbp = sub.add_parser("db", help="database schema")
    dsub = dbp.add_subparsers(dest="db_command", required=True)
    with_db(dsub.add_parser("upgrade", help="migrate to the newest schema")).add_argument("--revision", default="head")
    with_db(dsub.add_parser("downgrade", help="migrate down")).add_argument("--revision", default="base")
    with_db(dsub.add_parser("current", help="print the schema revision"))

    p = sub.add_parser("cache", help="list the artifact cache (and optionally shrink it)")
    p.add_argument("--config", required=True, type=Path, help="the config whose cache_dir to look at")
    p.add_argument("--limit-gb", type=float, help="evict least recently used entries down to this size")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("demo-repo", help="create the bundled example's git repository")
    p.add_argument("path", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``abwatch`` console script."""
    args = _parser().parse_args(argv)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return _dispatch(args, err)
    except (ConfigError, RepoError, RecordError, db.SchemaError, driver.DriverError, RunnerUnavailable) as exc:
        err.print(f"abwatch: error: {exc}", markup=False)
        return EXIT_USAGE


def _dispatch(args: argparse.Namespace, err: Console) -> int:
    if args.command == "demo-repo":
        from service.demo import make_demo_repo
        tags = make_demo_repo(args.path)
        err.print(f"example repository at {args.path} with tags {', '.join(tags)}", markup=False)
        return 0
    if args.command == "cache":
        return _cache_command(args, err)
    url = db.resolve_database_url(args.db)
    if args.command == "db":
        return _db_command(args, url)
    config = load_config(args.config) if args.command == "compare" else None
    engine = db.make_engine(url)
    db.ensure_schema(engine)
    # Reports piped to a file or CI log get a wide table instead of rich's default 80 columns.
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    with db.session_scope(engine) as session:
        if args.command == "compare":
            with RichProgress(err) as progress:
                outcome = driver.run_compare(session, config, args.control, args.treatment, progress=progress)
            _print_outcome(out, outcome, args.json)
            return outcome.exit_code
        if args.command == "verify":
            with RichProgress(err) as progress:
                outcome, regressions = driver.run_verify(session, args.run_id, progress=progress)
            if args.json:
                print(json.dumps({**outcome.to_json(), "regressions": [_regression_json(r) for r in regressions]}))
            else:
                _print_outcome(out, outcome, False)
                _print_regressions(out, regressions)
            confirmed = any(r.state == RegressionState.REGRESS for r in regressions)
            return driver.EXIT_BUILD_FAILED if outcome.exit_code == 3 else int(confirmed)
        if args.command == "regressions":
            query = select(Regression).order_by(Regression.id)
            if args.state:
                query = query.where(Regression.state == RegressionState(args.state))
            rows = list(session.scalars(query))
            if args.json:
                print(json.dumps([_regression_json(r) for r in rows]))
            else:
                _print_regressions(out, rows)
            return 0
        if args.command == "records":
            return _records_command(args, session, err)
        if args.command == "history":
            return _history_command(args, session, out)
    raise AssertionError(args.command)


def _cache_command(args: argparse.Namespace, err: Console) -> int:
    from dataclasses import asdict

    from builders.cache import ArtifactCache

    cache = ArtifactCache(load_config(args.config).cache_dir / "artifacts")
    if args.limit_gb is not None:
        removed = cache.evict(int(args.limit_gb * 2**30))
        err.print(f"evicted {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}", markup=False)
    entries, size = cache.describe(), cache.size_bytes()
    if args.json:
        print(json.dumps({"root": str(cache.root), "bytes": size, "entries": [asdict(e) for e in entries]}))
        return 0
    table = Table(title=f"{cache.root}: {len(entries)} entries, {size / 2**20:.1f} MiB on disk")
    for column in ("key", "builder", "sha", "last used", "files", "packed"):
        table.add_column(column)
    for e in entries:
        table.add_row(e.key, e.builder or "", (e.sha or "")[:12], e.last_used[:19], str(e.files), str(e.packed_files))
    Console(highlight=False).print(table)
    return 0


def _db_command(args: argparse.Namespace, url: str) -> int:
    if args.db_command == "upgrade":
        db.upgrade(url, args.revision)
    elif args.db_command == "downgrade":
        db.downgrade(url, args.revision)
    print(db.current_revision(db.make_engine(url)) or "(empty)")
    return 0


def _records_command(args: argparse.Namespace, session, err: Console) -> int:
    if args.records_command == "import":
        rows = import_records(session, args.file)
        err.print(f"imported {len(rows)} record(s) from {args.file}", markup=False)
        return 0
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            count = export_records(session, handle, args.run_id, args.workload)
    else:
        count = export_records(session, sys.stdout, args.run_id, args.workload)
    err.print(f"exported {count} record(s)", markup=False)
    return 0


def _history_command(args: argparse.Namespace, session, out: Console) -> int:
    points = history.series(session, args.workload, args.device)
    if not points:
        raise driver.DriverError(f"no history for workload {args.workload!r}"
                                 + (f" on device {args.device!r}" if args.device else ""))
    found = history.steps(points, max_pvalue=args.max_pvalue)
    if args.json:
        print(json.dumps({
            "workload": args.workload,
            "series": [{"sha": p.sha, "median_ms": p.median_ms, "runs": p.runs,
                        "committed_at": p.committed_at.isoformat() if p.committed_at else None} for p in points],
            "steps": [{"last_before": s.last_before.sha, "first_after": s.first_after.sha,
                       "change_pct": s.change_pct, "p_value": s.p_value} for s in found],
        }))
        return 0
    out.print(f"{args.workload}: {len(points)} commits, {len(found)} step change(s)", markup=False)
    for s in found:
        out.print(f"  {s.change_pct:+.2f}% (p={s.p_value:.2g}) starts after {s.last_before.sha[:12]} "
                  f"at {s.first_after.sha[:12]} {s.first_after.summary}", markup=False)
    return 0


def _print_outcome(out: Console, outcome: CompareOutcome, as_json: bool) -> None:
    if as_json:
        print(json.dumps(outcome.to_json()))
        return
    for b in outcome.builds:
        note = " (cached)" if b.cached else ""
        out.print(f"{b.side:9} {b.ref} {b.sha[:12]} {b.status}{note}", markup=False)
    table = Table(title=f"run {outcome.run_id} ({outcome.run_type}): {outcome.status}")
    for column in ("workload", "verdict", "change", "CI", "p", "control ms", "treatment ms", "n", "regression"):
        table.add_column(column)
    for r in outcome.results:
        v = r.verdict
        table.add_row(
            r.workload, f"[{VERDICT_STYLE[v.verdict.value]}]{v.verdict.value}[/]",
            "-" if v.change_pct is None else f"{v.change_pct:+.2f}%",
            "-" if v.ci_pct is None else f"[{v.ci_pct[0]:+.2f}, {v.ci_pct[1]:+.2f}]",
            "-" if v.p_value is None else f"{v.p_value:.2g}",
            "-" if v.control_median_ms is None else f"{v.control_median_ms:.3f}",
            "-" if v.treatment_median_ms is None else f"{v.treatment_median_ms:.3f}",
            f"{v.control_n}/{v.treatment_n}", "-" if r.regression_id is None else str(r.regression_id),
        )
    out.print(table)
    for r in outcome.results:
        if r.failure:
            out.print(f"{r.workload}: {r.failure}", markup=False)
        _print_tvm_details(out, r)


def _print_tvm_details(out: Console, r) -> None:
    """Compile times, the output error, and for a regression the operators that explain it."""
    details = r.details
    if not details:
        return
    compile_ms, error = details["compile_ms"], details["error"]
    out.print(f"{r.workload}: compile {compile_ms['control']:.0f} ms -> {compile_ms['treatment']:.0f} ms; "
              f"output max abs error {error['max_abs']:.3g}, max rel {error['max_rel']:.3g}"
              + (" — OUTPUT MISMATCH (correctness regression)" if error["mismatch"] else ""), markup=False)
    if r.verdict.verdict.value != "regression" or not details["ops"]:
        return
    table = Table(title=f"{r.workload}: operators behind the change")
    for column in ("operator", "type", "control µs", "treatment µs", "change", "share of change"):
        table.add_column(column)
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for op in details["ops"][:10]:
        table.add_row(op["name"], op["type"], fmt(op["control_us"], ".1f"), fmt(op["treatment_us"], ".1f"),
                      fmt(op["change_pct"], "+.1f") + ("%" if op["change_pct"] is not None else ""),
                      fmt(op["share_pct"], ".0f") + ("%" if op["share_pct"] is not None else ""))
    out.print(table)


def _regression_json(r: Regression) -> dict:
    return {
        "id": r.id, "workload": r.workload.name, "kind": r.kind, "state": r.state.value, "change_pct": r.change_pct,
        "run_id": r.run_id, "control_sha": r.control_commit.sha, "treatment_sha": r.treatment_commit.sha,
        "benchmark_verdict": r.benchmark_verdict, "verify_verdict": r.verify_verdict,
        "events": [
            {"from": e.from_state.value if e.from_state else None, "to": e.to_state.value,
             "run_id": e.run_id, "reason": e.reason, "at": e.at.isoformat()}
            for e in r.events
        ],
    }


def _print_regressions(out: Console, rows: list[Regression]) -> None:
    table = Table(title="regressions")
    for column in ("id", "workload", "state", "change", "commits", "history"):
        table.add_column(column)
    for r in rows:
        history = "\n".join(
            f"{e.at:%Y-%m-%d %H:%M} {e.from_state.value if e.from_state else '-'}→{e.to_state.value}: {e.reason}"
            for e in r.events
        )
        table.add_row(str(r.id), r.workload.name, r.state.value, f"{r.change_pct:+.2f}%",
                      f"{r.control_commit.sha[:10]}..{r.treatment_commit.sha[:10]}", history)
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
