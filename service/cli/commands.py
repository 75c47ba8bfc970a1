"""What each ``abwatch`` command does: :func:`run` takes the parsed arguments of
:mod:`service.cli.main`, dispatches, and turns every failure into a message and an exit code.

Kept apart from the parser so that ``abwatch --help`` and ``--version`` import none of this.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from abwatch.core.redact import mask_secrets, mask_url, register_secrets
from abwatch.core.errors import UsageError
from abwatch.builders import sandbox
from abwatch.builders.spec import SandboxConfig
from abwatch.service.cli import cache_report, history_command, report
from abwatch.service.compare import liveness
from abwatch.service.read import stored, triage_report
from abwatch.service.store import db
from abwatch.service.config import Config, ConfigError, load_config
from abwatch.service.exits import EXIT_BUILD_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from abwatch.service.compare.outcome import DriverError, NothingToVerify
from abwatch.service.store.models import Regression, Run
from abwatch.service.stats.verdict import Direction, RegressionState

# Each command imports what it runs (driver, statistics, web, runners): `abwatch regressions` none of it.


# Commands that store something; only these create or migrate a schema.
WRITING_COMMANDS = frozenset({"compare", "verify", "triage", "serve", "watch", "worker", "try"})
# Commands that build commits and run workloads: code under test, sandboxed.
RUNS_CODE = frozenset({"compare", "verify", "watch", "worker"})


def run(args: argparse.Namespace) -> int:
    """Carry out the command ``args`` names; its exit code (README, "Operations")."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    liveness.stop_on_sigterm()
    try:
        return _dispatch(args, err)
    except UsageError as exc:  # a bad config, ref, record, run id, device...: the message names it
        err.print(f"abwatch: error: {exc}", markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        err.print(f"abwatch: interrupted ({exc or 'SIGINT'}); the run is marked interrupted, "
                  "what it measured is kept", markup=False)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place an unexpected error becomes a message and a code
        if os.environ.get("ABWATCH_DEBUG"):
            traceback.print_exc()
        err.print(f"abwatch: {_describe(exc, getattr(args, 'db', None))}", markup=False)
        return EXIT_INTERNAL


def _describe(exc: Exception, db_arg: str | None) -> str:
    """One line naming an unexpected error's cause: the database (password masked), the file."""
    from abwatch.service.compare import infra  # loads the builders: only when an error is described

    lost = db.lost_connection(exc)
    infrastructure = infra.describe(exc)
    if infrastructure is not None and lost is None:  # a full disk, a missing build tool: not the commit's
        return infrastructure
    if lost is not None:  # not the PendingRollbackError a later use of the session raised
        exc = lost  # type: ignore[assignment]
    if isinstance(exc, SQLAlchemyError):
        where = mask_url(db.resolve_database_url(db_arg))
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return f"database error at {where}: {type(exc).__name__}: {first}"
    if isinstance(exc, OSError) and exc.filename:
        return f"error: {exc.strerror or exc}: {exc.filename}"
    return (f"internal error: {type(exc).__name__}: {mask_url(str(exc))} "
            "(set ABWATCH_DEBUG=1 for the traceback)")


def _dispatch(args: argparse.Namespace, err: Console) -> int:
    if args.command == "demo-repo":
        from abwatch.service.cli.demo import make_demo_repo
        tags = make_demo_repo(args.path)
        err.print(f"example repository at {args.path} with tags {', '.join(tags)}", markup=False)
        return 0
    out = report.stdout_console()
    if args.command == "cache":
        return _cache_command(args, err, out)
    url = db.resolve_database_url(args.db)
    if args.command == "db":
        return _db_command(args, url, err)
    config = load_config(args.config) if args.command in ("compare", "serve", "watch", "worker", "try") else None
    _protect(args, config, url, err)
    engine = db.open_database(url, write=args.command in WRITING_COMMANDS
                              or (args.command == "records" and args.records_command == "import"))
    for note in liveness.reap_quietly(engine):
        err.print(f"abwatch: {note}", markup=False)
    if args.command == "serve":
        return _serve(args, config, engine)
    if args.command in ("watch", "worker"):
        return _watch_command(args, config, engine, err)
    with db.session_scope(engine) as session:
        return SESSION_COMMANDS[args.command](Call(args, session, out, err, config))


def _protect(args: argparse.Namespace, config: Config | None, url: str, err: Console) -> None:
    """Before anything runs: the secrets this process knows are masked in whatever it stores or
    shows, and the code under test it runs is sandboxed (or stderr says loudly why not)."""
    if config is None and args.command == "verify" and getattr(args, "config", None):
        config = load_config(args.config)  # verify's config names its webhooks and [sandbox]
    register_secrets(config.secret_variables() if config else (), [url])
    if args.command not in RUNS_CODE:
        return
    hide = [args.config] if getattr(args, "config", None) else []
    warning = sandbox.configure(config.sandbox if config else SandboxConfig(), hide=hide)
    if warning:
        err.print(f"abwatch: {warning}", markup=False)


@dataclass(frozen=True)
class Call:
    """What a command that reads or writes the database is given."""

    args: argparse.Namespace
    session: Session
    out: Console
    err: Console
    config: Config | None  # loaded before the database was opened, for the commands that take one


def _compare_command(call: Call) -> int:
    from abwatch.service.compare import driver

    assert call.config is not None  # loaded before the database was opened
    args = call.args
    with report.RichProgress(call.err) as progress:
        outcome = driver.run_compare(call.session, call.config, args.control, args.treatment, progress=progress)
    # rendered from the stored rows, so `abwatch show` prints the very same report
    report.print_outcome(call.out, stored.load_outcome(call.session, outcome.run_id), args.json, args.ops)
    return outcome.exit_code


def _show_command(call: Call) -> int:
    report.print_outcome(call.out, stored.load_outcome(call.session, call.args.run_id), call.args.json,
                         call.args.ops)
    return 0


def _runs_command(call: Call) -> int:
    rows = stored.list_runs(call.session, call.args.limit)
    print(json.dumps(report.runs_json(rows))) if call.args.json else report.print_runs(call.out, rows)
    return 0


def _regressions_command(call: Call) -> int:
    # a confirmed improvement ([watch] bisect) is no regression: listed only with --improvements
    direction = Direction.FASTER if getattr(call.args, "improvements", False) else Direction.SLOWER
    query = select(Regression).where(Regression.direction == direction).order_by(Regression.id)
    if call.args.state:
        query = query.where(Regression.state == RegressionState(call.args.state))
    regressions = list(call.session.scalars(query))
    if call.args.json:
        print(json.dumps([report.regression_json(call.session, r) for r in regressions]))
        return 0
    report.print_regressions(call.out, regressions, "improvements" if direction is Direction.FASTER else "regressions")
    if not call.args.state and direction is Direction.SLOWER:  # a build regression has no state of its own
        report.print_build_regressions(call.out, stored.build_regressions(call.session))
    return 0


def _status_command(call: Call) -> int:
    from abwatch.service.read import queries

    found = queries.watch_status(call.session)
    print(json.dumps(found)) if call.args.json else report.print_status(call.out, found)
    return 0


# The commands that run in one database session, by name.
SESSION_COMMANDS: dict[str, Callable[[Call], int]] = {
    "compare": _compare_command,
    "verify": lambda c: _verify_command(c.args, c.session, c.err, c.out),
    "show": _show_command,
    "runs": _runs_command,
    "builds": lambda c: _builds_command(c.args, c.session, c.out),
    "regressions": _regressions_command,
    "status": _status_command,
    "records": lambda c: _records_command(c.args, c.session, c.err),
    "triage": lambda c: _triage_command(c.args, c.session, c.out),
    "history": lambda c: history_command.run(c.args, c.session, c.out, c.err),
    "try": lambda c: _try_command(c),
    "report": lambda c: _report_command(c),
}


def _report_command(call: Call) -> int:
    """``abwatch report``: the triage report of a window (:mod:`service.read.triage_report`)."""
    try:
        since = triage_report.parse_since(call.args.since)
    except triage_report.ReportError as exc:
        raise UsageError(str(exc)) from None
    data = triage_report.build(call.session, since, dashboard_url=call.args.dashboard_url)
    print(json.dumps(data, indent=2) if call.args.json
          else triage_report.to_markdown(data) if call.args.markdown else triage_report.to_text(data))
    return 0


def _try_command(call: Call) -> int:
    """``abwatch try``: queue the comparison for the device's workers; say how to follow it."""
    from abwatch.service.read import serialize
    from abwatch.service.watch import tryjob
    from abwatch.service.watch.device_config import device_names

    config, args = call.config, call.args
    assert config is not None, "try loads its config"
    device = args.device or device_names(config)[0]
    job = tryjob.submit(call.session, config, tryjob.TryRequest(device, args.control, args.treatment,
                                                                args.workload, args.verify, getpass.getuser()))
    if args.json:
        print(json.dumps(serialize.job_json(job)))
    else:
        call.out.print(f"try job {job.id} queued on {device}: {job.payload['control'][:12]} -> "
                       f"{job.payload['treatment'][:12]}; `abwatch status` or GET /api/jobs/{job.id} follows it "
                       f"(a watch or `abwatch worker --device {device}` runs it)", markup=False)
    return 0


def _watch_command(args: argparse.Namespace, config, engine, err: Console) -> int:
    from abwatch.service.watch import daemon

    if config.repo is None:
        raise ConfigError(f"{args.config}: repo: a watch needs [repo]")
    progress = report.LineProgress(err)
    if args.command == "worker":
        if engine.dialect.name != "postgresql":
            raise ConfigError("abwatch worker needs PostgreSQL (--db or $ABWATCH_DATABASE_URL); "
                              "on SQLite `abwatch watch` runs the jobs itself")
        if args.builds:  # a build host (the parser refuses --device with it)
            return daemon.work_builds(engine, config, progress=progress)
        return daemon.work(engine, config, args.device or daemon.device_names(config)[0], progress=progress)
    if args.once:
        return daemon.once(engine, config, work=not args.no_work, progress=progress)
    return daemon.forever(engine, config, work=not args.no_work, progress=progress)


def _verify_command(args: argparse.Namespace, session, err: Console, out: Console) -> int:
    from abwatch.service.compare import driver, verify
    from abwatch.service.notify import alerts

    live = load_config(args.config).alerts if args.config else None  # a bad file fails before the work
    try:
        with report.RichProgress(err) as progress:
            outcome, regressions = verify.run_verify(session, args.run_id, progress=progress)
    except NothingToVerify as exc:
        # not a usage error: the run exists and simply has nothing left to check
        if args.json:
            print(json.dumps({"run_id": args.run_id, "verified": None, "regressions": [], "message": str(exc)}))
        err.print(f"abwatch: {exc}", markup=False)
        return 0
    if live is None:  # the run's own config: its env: webhooks can be sent, redacted URLs wait
        live = Config.model_validate(session.get_one(Run, args.run_id).config).alerts
    for sent in alerts.deliver_pending(driver.engine_of(session), live):
        err.print(f"alert to {sent.webhook}: " + ("delivered" if sent.ok else f"not delivered ({sent.error})"),
                  markup=False)
    shown = stored.load_outcome(session, outcome.run_id)
    if args.json:
        print(json.dumps({**report.outcome_json(shown),
                          "regressions": [report.regression_json(session, r) for r in regressions]}))
    else:
        report.print_outcome(out, shown, False, args.ops)
        report.print_regressions(out, regressions)
    confirmed = any(r.state == RegressionState.REGRESS and r.direction is Direction.SLOWER for r in regressions)
    return EXIT_BUILD_FAILED if outcome.exit_code == 3 else int(confirmed)


def _builds_command(args: argparse.Namespace, session, out: Console) -> int:
    if args.log is not None:
        build = stored.get_build(session, args.log)
        log = mask_secrets(build.log)  # one stored before its secret was known
        sys.stdout.write(log if log.endswith("\n") or not log else log + "\n")
        return 0
    rows = stored.list_builds(session, args.failed, args.limit)
    if args.json:
        print(json.dumps(report.builds_json(rows)))
    else:
        report.print_builds(out, rows)
    return 0


def _cache_command(args: argparse.Namespace, err: Console, out: Console) -> int:
    from abwatch.builders.cache import ArtifactCache
    from abwatch.service.read.artifact_report import store_report
    from abwatch.service.read.ccache_report import compiler_cache_report

    config, url = load_config(args.config), db.resolve_database_url(args.db)
    register_secrets(config.secret_variables(), [url])
    cache = ArtifactCache(config.cache_dir / "artifacts")
    if args.limit_gb is not None:
        removed = cache.evict(int(args.limit_gb * 2**30))
        err.print(f"evicted {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}", markup=False)
    entries, size = cache.describe(verify=args.verify), cache.size_bytes()
    compiler = compiler_cache_report(config, url)  # tvm-source's ccache: local, remote, the builds' hits
    store = store_report(config, url, [e.key for e in entries])  # [artifacts] store: which entries it holds
    print(json.dumps(report.cache_json(cache, entries, size, compiler, store))) if args.json \
        else cache_report.print_cache(out, cache, entries, size, compiler, store)
    damaged = [e for e in entries if (e.check or "").startswith("damaged")]
    for e in damaged:
        err.print(f"abwatch: cache entry {e.key} is {e.check}", markup=False)
    return 1 if damaged else 0


def _serve(args: argparse.Namespace, config, engine) -> int:
    from abwatch.service.web.server import serve

    url = engine.url.render_as_string(hide_password=False)
    engine.dispose()  # the server opens its own, its pool sized by [server]
    return serve(url, config, args.host, args.port)


def _triage_command(args: argparse.Namespace, session, out: Console) -> int:
    from abwatch.service.read import triage

    try:
        changed = triage.triage(session, args.regression_id, args.status, who=args.who or getpass.getuser(),
                                issue_url=args.issue, note=args.note, fixed_by=args.fixed_by)
    except triage.TriageError as exc:
        raise DriverError(str(exc)) from None
    for r in changed:
        fix = f" by {args.fixed_by}" if args.fixed_by else ""
        out.print(f"regression {r.id} ({r.workload.name}): triaged as {args.status}{fix}", markup=False)
    return 0


def _db_command(args: argparse.Namespace, url: str, err: Console) -> int:
    if args.db_command == "grant-readonly":
        engine = db.make_engine(url)
        db.ensure_schema(engine)
        for statement in db.grant_readonly(engine, args.role):
            print(statement)
        return 0
    if args.db_command == "prune":
        return _prune(args, url, err)
    if args.db_command == "upgrade":
        db.upgrade(url, args.revision)
    elif args.db_command == "downgrade":
        if args.revision is None:
            raise DriverError("db downgrade needs --revision (e.g. the one before `abwatch db current`); "
                              "one that drops data (--revision base drops every table) needs --yes")
        losses = db.downgrade_losses(url, args.revision)
        listed = "".join(f"\n  {loss.rows} row(s): {loss.what} (migration {loss.revision})" for loss in losses)
        if (losses or args.revision == "base") and not args.yes:
            raise DriverError(f"db downgrade --revision {args.revision} "
                              + ("drops every table and all data in them" if args.revision == "base" else
                                 "drops or changes data that upgrading again does not bring back")
                              + (f":{listed}" if listed else "") + "\nadd --yes to confirm; nothing was changed")
        db.downgrade(url, args.revision)
        if losses:
            err.print(f"abwatch: downgraded to {args.revision}; dropped or changed:{listed}", markup=False)
    print(db.current_revision(db.make_engine(url)) or "(empty)")
    return 0


def _prune(args: argparse.Namespace, url: str, err: Console) -> int:
    """``abwatch db prune``: what would go (a dry run), or, with ``--yes``, delete it in batches."""
    from abwatch.service.store import prune

    try:
        cutoff = prune.cutoff_of(args.older_than)
    except ValueError as exc:
        raise DriverError(f"db prune: {exc}") from None
    engine = db.open_database(url, write=False)
    with db.session_scope(engine) as session:
        found = prune.plan(session, cutoff)
        print(prune.describe(found))
        if not args.yes:
            print("dry run: nothing was deleted; add --yes to delete these samples")
            return 0
        done = prune.prune(session, found, progress=lambda line: err.print(f"abwatch: {line}", markup=False))
    print(f"pruned {done.samples:,} sample(s) of {done.runs:,} run(s) in {done.seconds:.1f} s; the space is "
          "reused by new samples (VACUUM FULL samples on PostgreSQL, VACUUM on SQLite, returns it to the disk)")
    return 0


def _records_command(args: argparse.Namespace, session, err: Console) -> int:
    from abwatch.service.records import interchange
    from abwatch.service.records.v01 import RecordError, export_records, import_records

    if args.records_command == "import":
        if args.format == "aoe":
            rows, skipped = interchange.import_aoe(session, args.file, args.hardware)
        else:
            rows, skipped = import_records(session, args.file)
        err.print(f"imported {len(rows)} record(s) from {args.file}"
                  + (f"; {skipped} already stored, skipped" if skipped else ""), markup=False)
        return 0
    if args.format == "parquet":
        if not args.output:
            raise RecordError("records export --format parquet: give the file to write with --output")
        count = interchange.export_parquet(session, args.output, args.run_id, args.workload)
    elif args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            count = export_records(session, handle, args.run_id, args.workload)
    else:
        count = export_records(session, sys.stdout, args.run_id, args.workload)
    err.print(f"exported {count} record(s)", markup=False)
    return 0
