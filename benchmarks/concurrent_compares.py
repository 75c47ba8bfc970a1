"""Several `abwatch compare` processes at once on one fresh PostgreSQL database and one empty cache.

Prints, per process, its exit status and the last line it wrote to stderr; then what the
database holds (rows that must exist once: repositories, commits, devices, workloads,
successful builds per artifact) and how long the whole thing took.

    python -m benchmarks.concurrent_compares [--processes 3] [--python PATH] [--distinct-devices]

``--python`` runs another abwatch (another virtual environment's interpreter) against the
same setup, to compare a version before a fix with one after it. ``--distinct-devices`` gives
each process its own device name for the same machine, so the per-device lock does not keep
their measuring phases apart: what measuring at the same time does to the intervals.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from abwatch.service.cli.demo import make_demo_repo

ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
ONCE = ("repositories", "commits", "devices", "workloads")


def _config(work: Path, repo: Path, device: str | None = None) -> Path:
    path = work / f"abwatch-{device or 'shared'}.toml"
    runner = f"[runner]\ndevice = {json.dumps(device)}\n" if device else ""
    path.write_text(f"""
cache_dir = {json.dumps(str(work / 'cache'))}
[repo]
url = {json.dumps(str(repo))}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
kind = "command"
command = ["./bench", "10"]
[run]
repetitions = 10
warmup = 1
timeout_s = 30
seed = 7
max_repetitions = 40
{runner}""")
    return path


def main() -> None:
    """Run the processes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="interpreter whose abwatch to run")
    parser.add_argument("--admin-url", default=ADMIN_URL, help="maintenance database to create the test one from")
    parser.add_argument("--distinct-devices", action="store_true",
                        help="one device name per process (this machine under other names): no device lock between them")
    args = parser.parse_args()
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    name = f"abwatch_concurrency_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            make_demo_repo(work / "repo")
            configs = [_config(work, work / "repo", f"this-machine-{i}" if args.distinct_devices else None)
                       for i in range(args.processes)]
            pairs = [("v1.0", "v1.1"), ("v1.1", "v1.0")]
            started = time.monotonic()
            procs = [subprocess.Popen(
                [args.python, "-m", "abwatch.service.cli.main", "compare", "--config", str(configs[i]),
                 "--control", pairs[i % 2][0], "--treatment", pairs[i % 2][1], "--json", "--db", url],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(args.processes)]
            results = [(p.returncode, err, out) for p in procs for out, err in [p.communicate()]]
            wall = time.monotonic() - started
            print(f"{args.processes} concurrent compares ({args.python}): {wall:.1f} s wall")
            for i, (code, err, out) in enumerate(results):
                last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), "")
                print(f"  process {i}: exit {code}: {last[:160]}")
                try:
                    for r in json.loads(out)["results"]:  # an A/A pair: the interval's width is the noise
                        low, high = r["ci_pct"] or (float("nan"), float("nan"))
                        print(f"    {r['workload']}: {r['verdict']}, CI {low:+.1f}..{high:+.1f}% "
                              f"(width {high - low:.1f} points), n={r['control']['n']}")
                except (ValueError, KeyError, TypeError):
                    pass
            engine = create_engine(url)
            with engine.connect() as connection:
                tables = set(connection.execute(text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
                for table in ONCE:
                    if table in tables:
                        print(f"  {table}: {connection.execute(text(f'SELECT COUNT(*) FROM {table}')).scalar()} rows")
                if "builds" in tables:
                    dupes = connection.execute(text(
                        "SELECT COUNT(*) - COUNT(DISTINCT artifact_key) FROM builds WHERE status = 'success'")).scalar()
                    print(f"  successful builds stored twice: {dupes}")
                if "runs" in tables:
                    for status, count in connection.execute(text("SELECT status, COUNT(*) FROM runs GROUP BY status")):
                        print(f"  runs {status}: {count}")
            engine.dispose()
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
