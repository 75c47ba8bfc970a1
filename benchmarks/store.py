"""Years of nightly data: ingest rate through abwatch's write path, and query times.

    python -m benchmarks.store                       # 50 workloads x 4 devices x 730 nights, ~10.5 M samples
    python -m benchmarks.store --nights 60           # a quick look
    python -m benchmarks.store --write-docs docs/store.md
    python -m benchmarks.store --prune-older-than 90 # then prune: sizes, rows, seconds, queries again

Fills a throw-away PostgreSQL database (created on the server of ``--admin-url``, dropped
at the end unless ``--keep``) with the shape a nightly watch leaves: every night each device
runs treatment = that night's commit against control = the previous one, 50 workloads,
12 processes x 3 samples a side; step changes now and then, found as regressions that are
verified. Samples go through :func:`service.store.rows.write_samples` (COPY), the driver's own
path; the other rows through :func:`service.store.rows.copy_rows`. Then it times, on the full
database, the dashboard's queries (the functions the pages call) and every query of
docs/sql.md (median of 5 runs after a warm-up), and prints their EXPLAIN plans.

With ``--prune-older-than DAYS`` it then prunes as ``abwatch db prune --older-than DAYS --yes``
does (:mod:`service.store.prune`) and reports the rows dropped, the seconds it took, the
sizes of ``samples`` and of the database before, after (and after ``VACUUM FULL samples``),
and the dashboard's query times again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, UTC
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from abwatch.service.read import queries
from abwatch.service.store import db, prune
from abwatch.service.store.rows import copy_rows, write_samples

ROOT = Path(__file__).resolve().parent.parent
DEVICES = ("rasp4b-01", "jetson-orin-02", "c6i-xlarge-03", "rk3588-04")
NAMED = ("lcg-loop", "mlp", "cnn", "resnet18", "transformer", "te-matmul", "te-conv2d")
PROCESSES, SAMPLES = 12, 3


def sql_blocks() -> list[str]:
    """docs/sql.md's queries."""
    return re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "sql.md").read_text(), flags=re.S)


def _next_ids(session: Session, table: str, count: int) -> list[int]:
    """Reserve ``count`` ids of ``table``'s sequence (COPY cannot return them)."""
    return list(session.execute(text(f"SELECT nextval('{table}_id_seq') FROM generate_series(1, :n)"),
                                {"n": count}).scalars())


def fill(session: Session, nights: int, workloads: int, rng: random.Random) -> dict:
    """Write the nightly history; return counts and the time spent in the sample path."""
    start = datetime.now(UTC) - timedelta(days=nights)
    repo_id = session.execute(text("INSERT INTO repositories (url, created_at) VALUES ('https://github.com/apache/tvm', now()) RETURNING id")).scalar_one()
    commit_ids = _next_ids(session, "commits", nights + 1)
    copy_rows(session, "commits", ("id", "repository_id", "sha", "summary", "author", "committed_at"), [
        (cid, repo_id, uuid.UUID(int=rng.getrandbits(128)).hex + "0" * 8, f"[TIR] nightly change {i}",
         f"dev{i % 37} <dev{i % 37}@example.org>", start + timedelta(days=i, hours=-2))
        for i, cid in enumerate(commit_ids)])
    build_ids = _next_ids(session, "builds", nights + 1)
    copy_rows(session, "builds", ("id", "commit_id", "builder", "config_hash", "status", "artifact_key", "cached",
                                  "log", "duration_s", "created_at"),
              [(bid, cid, "tvm-source", "cfg", "success", f"k{bid}", False, "", 60 + rng.random() * 30,
                start + timedelta(days=i)) for i, (bid, cid) in enumerate(zip(build_ids, commit_ids, strict=False))])
    device_ids = [session.execute(text("INSERT INTO devices (name, kind, hardware_config) VALUES (:n, 'rpc', '{}') "
                                       "RETURNING id"), {"n": name}).scalar_one() for name in DEVICES]
    names = list(NAMED) + [f"onnx-model-{i:02d}" for i in range(workloads - len(NAMED))]
    workload_ids = [session.execute(text("INSERT INTO workloads (repository_id, name, spec_hash, kind, spec) "
                                         "VALUES (:r, :n, 'spec', 'tvm', '{}') RETURNING id"),
                                    {"r": repo_id, "n": name}).scalar_one() for name in names]
    session.commit()
    # each (workload, device) has its own level and a few step changes over the years
    level = {(w, d): rng.uniform(0.5, 50.0) for w in workload_ids for d in device_ids}
    counts = dict(runs=0, comparisons=0, invocations=0, samples=0, records=0, regressions=0)
    sample_s = total_s = 0.0
    for night in range(1, nights + 1):
        when = start + timedelta(days=night)
        run_ids = _next_ids(session, "runs", len(device_ids))
        copy_rows(session, "runs", (
            "id", "run_type", "status", "repository_id", "control_ref", "treatment_ref", "control_commit_id",
            "treatment_commit_id", "control_build_id", "treatment_build_id", "device_id", "seed", "config",
            "started_at", "finished_at"),
            [(rid, "benchmark", "completed", repo_id, "main~1", "main", commit_ids[night - 1], commit_ids[night],
              build_ids[night - 1], build_ids[night], did, night, "{}", when, when + timedelta(minutes=40))
             for rid, did in zip(run_ids, device_ids, strict=False)])
        pairs = [(rid, did, wid) for rid, did in zip(run_ids, device_ids, strict=False) for wid in workload_ids]
        comparison_ids = _next_ids(session, "comparisons", len(pairs))
        invocation_ids = iter(_next_ids(session, "invocations", len(pairs) * 2 * PROCESSES))
        comparisons, invocations, samples, records, found = [], [], [], [], []
        for cid, (rid, did, wid) in zip(comparison_ids, pairs, strict=False):
            before = level[(wid, did)]
            step = rng.random() < 0.004
            if step:
                level[(wid, did)] *= rng.choice((1.05, 1.08, 1.12, 0.93))
            after = level[(wid, did)]
            medians = {}
            for side, base in (("control", before), ("treatment", after)):
                values = []
                for position in range(PROCESSES):
                    iid = next(invocation_ids)
                    invocations.append((iid, rid, wid, side, 2 * position + (side == "treatment"), False, "ok",
                                        base * SAMPLES / 1000, ""))
                    for k in range(SAMPLES):
                        value = base * rng.gauss(1.0, 0.01)
                        values.append(value)
                        samples.append((iid, rid, wid, side, position * SAMPLES + k, value, False, None))
                medians[side] = statistics.median(values)
            change = (after / before - 1) * 100
            verdict = "regression" if step and change > 0 else "improvement" if step else "same"
            comparisons.append((cid, rid, wid, verdict, change, change - 0.8, change + 0.8, 0.0005 if step else 0.6,
                                medians["control"], medians["treatment"], PROCESSES * SAMPLES,
                                PROCESSES * SAMPLES, json.dumps({"reason": verdict})))
            for side in ("control", "treatment"):
                metrics = {"runtime_ms_median": medians[side], "n": PROCESSES * SAMPLES,
                           "compilation_ms": 900 + rng.random() * 200}
                records.append((rid, side, names[workload_ids.index(wid)], "tvm",
                                "main~1" if side == "control" else "main", DEVICES[device_ids.index(did)],
                                medians[side], 0.01 * medians[side], json.dumps(when.timestamp()), "0.1",
                                json.dumps({"metrics": metrics, "metadata": {"run_id": rid, "side": side}}), when))
            if verdict == "regression":
                found.append((wid, did, rid, cid, change, when))
        write_t0 = time.perf_counter()
        copy_rows(session, "comparisons", ("id", "run_id", "workload_id", "verdict", "change_pct", "ci_low_pct",
                                           "ci_high_pct", "p_value", "control_median_ms", "treatment_median_ms",
                                           "control_n", "treatment_n", "details"), comparisons)
        copy_rows(session, "invocations", ("id", "run_id", "workload_id", "side", "position", "warmup", "status",
                                           "wall_s", "message"), invocations)
        sample_t0 = time.perf_counter()
        write_samples(session, samples)
        sample_s += time.perf_counter() - sample_t0
        copy_rows(session, "records", ("run_id", "side", "workload", "engine", "engine_version", "hardware",
                                       "runtime_ms_mean", "runtime_ms_std", "timestamp", "schema_version",
                                       "fields", "created_at"), records)
        for wid, did, rid, cid, change, at in found:
            regression_id = session.execute(text(
                "INSERT INTO regressions (workload_id, device_id, control_commit_id, treatment_commit_id, run_id, "
                "comparison_id, state, kind, change_pct, created_at, updated_at) VALUES (:w, :d, :cc, :tc, :r, :c, "
                ":s, 'runtime', :p, :at, :at) RETURNING id"),
                dict(w=wid, d=did, cc=commit_ids[night - 1], tc=commit_ids[night], r=rid, c=cid, p=change, at=at,
                     s="regress" if rng.random() < 0.8 else "cleared")).scalar_one()
            copy_rows(session, "regression_events", ("regression_id", "from_state", "to_state", "run_id", "reason", "at"), [
                (regression_id, None, "benchmark", rid, "benchmark run: slower", at),
                (regression_id, "benchmark", "verify", rid, "verification started", at + timedelta(minutes=5)),
                (regression_id, "verify", "regress", rid, "reproduced", at + timedelta(hours=1))])
        session.commit()
        total_s += time.perf_counter() - write_t0
        counts["runs"] += len(run_ids)
        counts["comparisons"] += len(comparisons)
        counts["invocations"] += len(invocations)
        counts["samples"] += len(samples)
        counts["records"] += len(records)
        counts["regressions"] += len(found)
        if night % 50 == 0 or night == nights:
            print(f"  night {night}/{nights}: {counts['samples']:,} samples, "
                  f"{counts['samples'] / sample_s:,.0f} samples/s in write_samples", file=sys.stderr, flush=True)
    return {**counts, "sample_write_s": sample_s, "all_writes_s": total_s}


def _time(fn, repeat: int = 5) -> float:
    fn()  # warm-up: plans cached, pages in memory
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def dashboard_queries(session: Session) -> dict:
    """The functions the dashboard's pages and the API's reads call, with typical arguments."""
    run_id = session.execute(text("SELECT max(id) FROM runs")).scalar_one()
    regression_id = session.execute(text("SELECT max(id) FROM regressions")).scalar_one()
    device = DEVICES[0]
    return {
        "overview page (watched, open regressions, latest_status, recent runs)": lambda: queries.overview(session),
        "trend page's query: series of one workload, all devices": lambda: queries.series(
            session, "resnet18", change_points=False),
        "series of one workload on one device": lambda: queries.series(session, "resnet18", device,
                                                                       change_points=False),
        "one device's series with its change points (query + Otava)": lambda: queries.series(
            session, "resnet18", device),
        "run page: full A/B report with per-process medians": lambda: queries.run_report(session, run_id),
        "regression page": lambda: queries.regression_detail(session, regression_id),
        "regressions list, state=regress, one device": lambda: queries.list_regressions(
            session, state="regress", device=device),
        "runs list": lambda: queries.list_runs(session, 50),
    }


def main(argv: list[str] | None = None) -> int:
    """Fill, measure, print (and optionally write docs)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admin-url", default=os.environ.get(
        "ABWATCH_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--nights", type=int, default=730)
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="do not drop the database at the end")
    parser.add_argument("--write-docs", type=Path, help="write the figures and plans as Markdown here")
    parser.add_argument("--prune-older-than", type=float, metavar="DAYS",
                        help="then prune the samples of runs older than DAYS that opened nothing, and measure")
    args = parser.parse_args(argv)
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    name = f"abwatch_store_bench_{os.getpid()}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        db.upgrade(url)
        engine = db.make_engine(url)
        with Session(engine) as session:
            t0 = time.perf_counter()
            counts = fill(session, args.nights, args.workloads, random.Random(args.seed))
            wall = time.perf_counter() - t0
        raw = engine.raw_connection()  # VACUUM cannot run in a transaction
        raw.set_isolation_level(0)
        raw.cursor().execute("VACUUM ANALYZE")
        raw.close()
        size = _scalar(engine, "SELECT pg_size_pretty(pg_database_size(current_database()))")
        lines = [f"# Store benchmark ({args.nights} nights x {len(DEVICES)} devices x {args.workloads} workloads)", "",
                 f"- rows: {counts['samples']:,} samples, {counts['invocations']:,} invocations, "
                 f"{counts['comparisons']:,} comparisons, {counts['runs']:,} runs, {counts['records']:,} records, "
                 f"{counts['regressions']:,} regressions; database {size}",
                 f"- samples through `write_samples` (COPY): {counts['samples'] / counts['sample_write_s']:,.0f} samples/s",
                 f"- every row of the fill through abwatch's bulk path: {counts['samples'] / counts['all_writes_s']:,.0f} "
                 f"samples/s counting all tables' writes; {counts['samples'] / wall:,.0f} samples/s including "
                 f"generating the data in Python ({wall:.0f} s)", "",
                 "| query | median ms |", "| --- | ---: |"]
        plans = []
        with Session(engine) as session:
            for label, fn in dashboard_queries(session).items():
                lines.append(f"| {label} | {_time(fn):.1f} |")
            for number, sql in enumerate(sql_blocks(), start=1):
                statement = text(sql.replace(":", r"\:"))
                ms = _time(lambda statement=statement: session.execute(statement).fetchall())
                title = sql.strip().splitlines()[0] if sql.strip().startswith("--") else ""
                lines.append(f"| docs/sql.md query {number} {title.lstrip('- ')} | {ms:.1f} |")
                plan = session.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql.replace(":", r"\:")))
                plans.append((f"docs/sql.md query {number}", "\n".join(r[0] for r in plan)))
            for label, sql in (("workload_series, one workload", "SELECT * FROM workload_series WHERE workload = 'resnet18'"),
                               ("latest_status", "SELECT * FROM latest_status")):
                plan = session.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql))
                plans.append((label, "\n".join(r[0] for r in plan)))
        if args.prune_older_than is not None:
            lines += prune_figures(engine, args.prune_older_than)
        report = "\n".join(lines)
        print(report)
        for label, plan in plans:
            print(f"\n## {label}\n{plan}")
        if args.write_docs:
            args.write_docs.write_text(report + "\n\n## Plans\n\n" + "\n\n".join(
                f"### {label}\n\n```\n{plan}\n```" for label, plan in plans) + "\n")
        engine.dispose()
    finally:
        if not args.keep:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return 0


SIZES = ("SELECT pg_total_relation_size('samples'), pg_database_size(current_database()), "
         "(SELECT count(*) FROM samples)")


def _vacuum(engine, what: str) -> float:
    """Run ``VACUUM what`` (outside a transaction); its seconds."""
    raw = engine.raw_connection()
    raw.set_isolation_level(0)
    t0 = time.perf_counter()
    raw.cursor().execute(f"VACUUM {what}")
    raw.close()
    return time.perf_counter() - t0


def prune_figures(engine, days: float) -> list[str]:
    """Prune like ``abwatch db prune --older-than days --yes``; Markdown lines of what it did."""
    mib = 2 ** 20

    def sizes() -> tuple[int, int, int]:
        with engine.connect() as connection:
            return tuple(connection.execute(text(SIZES)).one())  # type: ignore[return-value]

    def timings() -> dict[str, float]:
        with Session(engine) as session:
            oldest = session.execute(text("SELECT min(id) FROM runs")).scalar_one()
            found = dashboard_queries(session)
            found["run page of a pruned run (the oldest)"] = lambda: queries.run_report(session, oldest)
            return {label: _time(fn) for label, fn in found.items()}

    before_q, before = timings(), sizes()
    with Session(engine) as session:
        t0 = time.perf_counter()
        found = prune.plan(session, prune.cutoff_of(days))
        plan_s = time.perf_counter() - t0
        session.commit()
        done = prune.prune(session, found, progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    vacuum_s = _vacuum(engine, "ANALYZE samples")
    after = sizes()
    full_s = _vacuum(engine, "FULL samples")
    _vacuum(engine, "ANALYZE samples")
    full, after_q = sizes(), timings()
    lines = ["", f"## Pruning samples older than {days:g} days", "",
             f"- plan (what goes; `db prune`'s dry run): {plan_s:.1f} s; {prune.describe(found)}",
             f"- prune: {done.samples:,} samples of {done.runs:,} runs deleted in {done.seconds:.1f} s "
             f"({done.samples / max(done.seconds, 1e-9):,.0f} samples/s, batches of {prune.BATCH_ROWS:,}); "
             f"then VACUUM ANALYZE samples {vacuum_s:.1f} s, VACUUM FULL samples {full_s:.1f} s", "",
             "| | samples rows | samples table + indexes | database |", "| --- | ---: | ---: | ---: |"]
    for label, (table, database, rows) in (("before", before), ("after prune + VACUUM", after),
                                           ("after VACUUM FULL samples", full)):
        lines.append(f"| {label} | {rows:,} | {table / mib:,.0f} MiB | {database / mib:,.0f} MiB |")
    lines += ["", "| query | before ms | after ms |", "| --- | ---: | ---: |"]
    lines += [f"| {label} | {before_q[label]:.1f} | {after_q[label]:.1f} |" for label in before_q]
    return lines


def _scalar(engine, sql: str):
    with engine.connect() as connection:
        return connection.execute(text(sql)).scalar_one()


if __name__ == "__main__":
    sys.exit(main())
