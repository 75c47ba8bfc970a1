"""The ``abwatch`` command line: the parser, and :func:`main`, the console script.

Exit status: :mod:`service.exits` (``abwatch --help`` lists them). Reports go to stdout;
progress goes to stderr so ``--json`` stays clean. What each command does is
:mod:`service.cli.commands`, imported once the arguments are parsed.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path
from collections.abc import Sequence

from abwatch.core.metric_names import SERIES
from abwatch.service.exits import MEANINGS
from abwatch.service.stats.verdict import RegressionState, TriageStatus

# Where the database is when --db does not say (service.store.db uses these; tests/test_cli_start.py
# checks they agree): named here so that building the parser imports no database code.
ENV_DATABASE_URL = "ABWATCH_DATABASE_URL"
DEFAULT_DATABASE_URL = "sqlite:///abwatch.db"

JSON_HELP = "print one JSON object (or array) on stdout instead of tables; progress stays on stderr"
OPS_HELP = "print the per-operator table of every TVM workload, not only of regressions"


def _version() -> str:
    try:
        return metadata.version("abwatch")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


Commands = argparse._SubParsersAction  # the parser's subcommands, each group added by a function below


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="abwatch", description="A/B performance-regression watch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in MEANINGS.items()))
    parser.add_argument("--version", action="version", version=f"abwatch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _running_commands(sub)
    _reading_commands(sub)
    _triage_commands(sub)
    _serving_commands(sub)
    _records_commands(sub)
    _db_commands(sub)
    _cache_commands(sub)
    return parser


def _with_db(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``p`` with the ``--db`` option every command on the database takes."""
    p.add_argument("--db", help=f"database URL (default: ${ENV_DATABASE_URL} or {DEFAULT_DATABASE_URL})")
    return p


def _running_commands(sub: Commands) -> None:
    """The commands that compare, verify and watch, and queue or take their jobs."""
    p = _with_db(sub.add_parser("compare", help="A/B-compare two refs of the configured repository"))
    p.add_argument("--config", required=True, type=Path, help="TOML config file")
    p.add_argument("--control", required=True, help="baseline ref (branch, tag or sha; a release for tvm-wheel)")
    p.add_argument("--treatment", required=True, help="ref under test")
    p.add_argument("--ops", action="store_true", help=OPS_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("verify", help="re-run a benchmark run's suspected regressions"))
    p.add_argument("run_id", type=int, help="the benchmark run whose regressions to verify")
    p.add_argument("--config", type=Path,
                   help="TOML config whose [alerts] webhooks are sent the alerts (the run's stored config "
                        "names them redacted; without this only env: webhooks can be sent now)")
    p.add_argument("--ops", action="store_true", help=OPS_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("watch", help="watch a branch: poll, queue, A/B-test, verify, bisect"))
    p.add_argument("--config", required=True, type=Path, help="TOML config file with [repo] and [watch]")
    p.add_argument("--once", action="store_true",
                   help="one pass and its jobs, then exit: 0 nothing confirmed, 1 a regression confirmed, "
                        "4 a job failed (named on stderr)")
    p.add_argument("--no-work", action="store_true", help="only poll and queue; workers run the jobs")
    p = _with_db(sub.add_parser("worker", help="run queued watch jobs of one device (PostgreSQL)"))
    p.add_argument("--config", required=True, type=Path, help="the watch's TOML config file")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--device", help="device whose jobs to take (default: the config's runner device)")
    which.add_argument("--builds", action="store_true",
                   help="take build jobs instead (a build host: pushes to [artifacts] store)")
    p = _with_db(sub.add_parser("try", help="queue an A/B comparison on a watch device; its workers run it"))
    p.add_argument("--config", required=True, type=Path, help="the watch's TOML config file")
    p.add_argument("--device", help="the device to run on (default: the watch's first device)")
    p.add_argument("--control", required=True, help="baseline ref (resolved now; the job keeps the sha)")
    p.add_argument("--treatment", required=True, help="ref under test")
    p.add_argument("--workload", action="append", default=[], help="only this workload (repeatable; default: all)")
    p.add_argument("--verify", action="store_true", help="verify a regression it finds, as the watch does")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = _with_db(sub.add_parser("status", help="watched branches, last tested commits, the queue per device"))
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _reading_commands(sub: Commands) -> None:
    """The commands that read stored runs, builds, regressions and series."""
    p = _with_db(sub.add_parser("show", help="print an earlier run's report again, from the database"))
    p.add_argument("run_id", type=int, help="the run to show (see `abwatch runs`)")
    p.add_argument("--ops", action="store_true", help=OPS_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("runs", help="list runs, newest first"))
    p.add_argument("--limit", type=int, default=20, help="how many runs (default: 20)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("builds", help="list builds, newest first, or print one build's log"))
    p.add_argument("--failed", action="store_true", help="only failed builds")
    p.add_argument("--limit", type=int, default=20, help="how many builds (default: 20)")
    p.add_argument("--log", type=int, metavar="ID", help="print the whole log of build ID")
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("regressions", help="list regressions and their state changes"))
    p.add_argument("--state", choices=[s.value for s in RegressionState], help="only regressions in this state")
    p.add_argument("--improvements", action="store_true",
                   help="the confirmed improvements instead ([watch] bisect = [..., \"improvement\"]), each with "
                        "the commit that made it faster")
    p.add_argument("--json", action="store_true", help=JSON_HELP)

    p = _with_db(sub.add_parser("history", help="a workload's per-commit series and its step changes; "
                               "--metric binary-size: each build configuration's sizes"))
    p.add_argument("workload", nargs="?", help="workload name, as in the config (none with --metric binary-size)")
    p.add_argument("--device", help="device (record 'hardware') to restrict to")
    p.add_argument("--fingerprint", metavar="HASH",
                   help="with --device: which of its fingerprints (a hash prefix; default: the newest measured)")
    p.add_argument("--metric", choices=SERIES,
                   default="time", help="what the series follows: a metric of the run, or compile- of the compile "
                        "(default: time; instructions, cpu-time, max-rss, an LLM's ttft, decode-latency, tokens-per-s "
                        "where measured)")
    p.add_argument("--max-pvalue", type=float, default=0.001,
                   help="largest p-value at which a step change is reported (default: 0.001)")
    p.add_argument("--series", type=int, metavar="ID",
                   help="which series of the name (one per repository and spec; default: the newest measured)")
    p.add_argument("--all-branches", action="store_true",
                   help="every measured commit, not only the configured branch's first-parent line")
    p.add_argument("--builder", help="with --metric binary-size: only this builder's configurations")
    p.add_argument("--config-hash", metavar="HASH", help="with --metric binary-size: only this configuration "
                   "(a prefix of its hash)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _triage_commands(sub: Commands) -> None:
    """The commands of triage: a decision about a regression, the report of them."""
    p = _with_db(sub.add_parser("triage", help="record a decision about a regression"))
    p.add_argument("regression_id", type=int, help="the regression (see `abwatch regressions`)")
    p.add_argument("--as", dest="status", required=True, choices=[s.value for s in TriageStatus],
                   help="the decision")
    p.add_argument("--issue", help="URL of the issue that tracks it")
    p.add_argument("--note", default="", help="why")
    p.add_argument("--who", default=None, help="who decided (default: the login name)")
    p.add_argument("--fixed-by", metavar="SHA", help="with --as fixed: the commit that fixed it (7 to 40 hex digits)")

    p = _with_db(sub.add_parser("report", help="the triage report: new, confirmed, fixed and untriaged regressions"))
    p.add_argument("--since", default="7d", help="the window: 7d, 36h, 2w, or an ISO date (default: 7d)")
    p.add_argument("--dashboard-url", help="base URL of the dashboard, for links to each regression")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--markdown", action="store_true", help="Markdown, to paste into a forum post or an issue")
    form.add_argument("--json", action="store_true", help=JSON_HELP)


def _serving_commands(sub: Commands) -> None:
    """``serve``: the REST API and the dashboard."""
    p = _with_db(sub.add_parser("serve", help="serve the REST API and the dashboard"))
    p.add_argument("--config", required=True, type=Path, help="TOML config file ([server], [alerts])")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")


def _records_commands(sub: Commands) -> None:
    """``records``: export and import TVM benchmark records."""
    records = sub.add_parser("records", help="TVM benchmark records (schema v0.1)")
    rsub = records.add_subparsers(dest="records_command", required=True)
    p = _with_db(rsub.add_parser("export", help="write stored records"))
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl", help="output format (default: jsonl)")
    p.add_argument("--run", type=int, dest="run_id", help="only this run's records")
    p.add_argument("--workload", help="only this workload's records")
    p.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    p = _with_db(rsub.add_parser("import", help="validate and store records (all or nothing; "
                                               "records already stored are skipped)"))
    p.add_argument("file", type=Path, help="JSON lines, a JSON array, or one JSON object (or an AOE report)")
    p.add_argument("--format", choices=["jsonl", "aoe"], default="jsonl",
                   help="jsonl: v0.1 records; aoe: an Ascend AOE tuning report (aoe_result_*.json)")
    p.add_argument("--hardware", default="ascend", help="aoe: the device the report was tuned on")


def _db_commands(sub: Commands) -> None:
    """``db``: the database's schema, its pruning and its read-only role."""
    dbp = sub.add_parser("db", help="database schema")
    dsub = dbp.add_subparsers(dest="db_command", required=True)
    _with_db(dsub.add_parser("upgrade", help="migrate to the newest schema")).add_argument(
        "--revision", default="head", help="revision to migrate to (default: head)")
    p = _with_db(dsub.add_parser("downgrade", help="migrate down to a revision (base drops every table)"))
    p.add_argument("--revision", help="revision to migrate down to, e.g. 0003, or base")
    p.add_argument("--yes", action="store_true", help="confirm a downgrade that drops or changes data (it lists what; base deletes all)")
    _with_db(dsub.add_parser("current", help="print the schema revision"))
    p = _with_db(dsub.add_parser("prune", help="delete the raw samples of old runs that opened nothing "
                                              "(runs, verdicts, invocations and regressions are kept); "
                                              "a dry run unless --yes"))
    p.add_argument("--older-than", type=float, required=True, metavar="DAYS",
                   help="runs that finished more than DAYS days ago")
    p.add_argument("--yes", action="store_true", help="delete (without it: say what would go, change nothing)")
    p = _with_db(dsub.add_parser("grant-readonly", help="let a PostgreSQL role read everything and change nothing"))
    p.add_argument("role", help="the role to create or grant to")


def _cache_commands(sub: Commands) -> None:
    """``cache`` and ``demo-repo``: the artifact cache, and the bundled example's repository."""
    p = _with_db(sub.add_parser("cache", help="list the artifact cache and the compiler cache's hits (and "
                                             "optionally shrink the artifact cache)"))
    p.add_argument("--config", required=True, type=Path, help="the config whose cache_dir to look at")
    p.add_argument("--limit-gb", type=float, help="evict least recently used entries down to this size")
    p.add_argument("--verify", action="store_true",
                   help="check every entry against what it was stored with (sizes, times, content hashes); "
                        "exit 1 if one is damaged (a build of it rebuilds it)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p = sub.add_parser("demo-repo", help="create the bundled example's git repository")
    p.add_argument("path", type=Path, help="where to create it")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``abwatch`` console script (exit codes: README, "Operations").

    Parsing needs nothing but the standard library: ``--help``, ``--version`` and usage errors
    answer before the database, statistics and web stacks are imported (:mod:`service.cli.commands`).
    """
    args = _parser().parse_args(argv)
    from abwatch.service.cli import commands

    return commands.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
