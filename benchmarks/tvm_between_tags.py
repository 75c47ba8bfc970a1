"""apache/tvm built from source at commits whose tvm-ffi pin sits between release tags, each
compared with its first-parent neighbour on the built-in MLP, a TE matmul and a script workload.

    python -m benchmarks.tvm_between_tags --tvm /mirrors/apache/tvm --mirrors /mirrors/ \\
        --dlpack /mirrors/dlpack-from-tvm-ffi-0.1.13 --cache /srv/abwatch-cache \\
        --pair 1240649257:96b8257002 --pair 44dbd138d5:9dcc731316

Each pair goes through ``abwatch compare`` with the ``tvm-source`` builder (the offline answers
of docs/tvm-nightly.md: ``submodule_rewrites`` to the mirrors, dlpack from
``submodule_fallbacks``), so the builds, the tvm-ffi package between tags and the verdicts are
the service's own. Prints one JSON line per pair and Markdown rows of builds and verdicts.
Nothing here runs in CI: a clean TVM build with LLVM takes most of an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from abwatch.service.store import db
from abwatch.service.store.models import Build

WORKLOADS = Path(__file__).resolve().parent.parent / "config" / "workloads"
CONFIG = """
cache_dir = {cache}
[repo]
url = {tvm}
[build]
kind = "tvm-source"
cmake = {{USE_LLVM = {llvm}, USE_CUDA = "OFF"}}
submodules = ["3rdparty/tvm-ffi"]
submodule_rewrites = {{"https://github.com/" = {mirrors}}}
submodule_fallbacks = {{"3rdparty/tvm-ffi/3rdparty/dlpack" = {dlpack}}}
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [1, 256]
[[workloads]]
name = "matmul"
kind = "tvm"
model = "te:matmul"
options = {{m = 128, k = 128, n = 128}}
[[workloads]]
name = "attention"
kind = "tvm"
model = {script}
[run]
repetitions = 8
max_seconds = {max_seconds}
compile_repetitions = 8
noise_aware = false
[runner]
kind = "cpu"
device = "between-tags-x86"
threads = 1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tvm", required=True, help="apache/tvm repository (a local mirror)")
    parser.add_argument("--mirrors", required=True, help="what https://github.com/ is rewritten to")
    parser.add_argument("--dlpack", required=True, help="the dlpack tree standing in for a missing pin")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--llvm", default="/usr/lib/llvm-19/bin/llvm-config")
    parser.add_argument("--pair", action="append", required=True, metavar="CONTROL:TREATMENT")
    parser.add_argument("--max-seconds", type=float, default=60)
    args = parser.parse_args()
    config = args.cache / "between-tags.toml"
    config.write_text(CONFIG.format(
        cache=json.dumps(str(args.cache)), tvm=json.dumps(args.tvm), llvm=json.dumps(args.llvm),
        mirrors=json.dumps(args.mirrors), dlpack=json.dumps(args.dlpack), max_seconds=args.max_seconds,
        script=json.dumps(f"script:{WORKLOADS / 'attention_tvmscript.py'}")))
    database = f"sqlite:///{args.cache / 'between-tags.db'}"
    rows = []
    for pair in args.pair:
        control, treatment = pair.split(":")
        started = time.monotonic()
        # compare's progress goes to a file beside the cache, to follow a build of most of an hour
        progress = args.cache / f"between-tags-{control}-{treatment}.log"
        with progress.open("w") as err:
            proc = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config",
                                   str(config), "--control", control, "--treatment", treatment, "--json",
                                   "--db", database], stdout=subprocess.PIPE, stderr=err, text=True)
        wall = time.monotonic() - started
        try:
            payload = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(json.dumps({"pair": pair, "exit": proc.returncode, "progress": str(progress),
                              "stderr": progress.read_text()[-3000:]}), flush=True)
            continue
        engine = db.make_engine(database)
        with db.session_scope(engine) as session:
            builds = {b["side"]: session.scalars(select(Build).where(Build.id == b["build_id"])).one()
                      for b in payload["builds"]}
            build_rows = {side: {"status": b.status.value, "seconds": round(b.duration_s or 0, 1),
                                 "steps": (b.metrics or {}).get("steps"),
                                 "ccache_hit_rate": (b.metrics or {}).get("ccache_hit_rate"),
                                 "tvm_ffi": _ffi_line(b.log)} for side, b in builds.items()}
        engine.dispose()
        row = {"pair": pair, "exit": proc.returncode, "wall_s": round(wall, 1), "builds": build_rows,
               "results": [{"workload": r["workload"], "verdict": r["verdict"], "change_pct": r.get("change_pct"),
                            "ci_pct": r.get("ci_pct"), "compile": (r.get("compile") or {}).get("verdict")}
                           for r in payload["results"]]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| control → treatment | builds (seconds, Ninja steps, ccache hits) | workload | verdict | change | compile |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        builds = "; ".join(f"{side} {b['status']} {b['seconds']} s, {b['steps']} steps"
                           + (f", {b['ccache_hit_rate']:.0%}" if b["ccache_hit_rate"] is not None else "")
                           for side, b in row["builds"].items())
        for r in row["results"]:
            change = f"{r['change_pct']:+.2f} %" if r["change_pct"] is not None else "-"
            print(f"| `{row['pair']}` | {builds} | {r['workload']} | {r['verdict']} | {change} | {r['compile']} |")


def _ffi_line(log: str) -> str | None:
    """The build log's note on the tvm-ffi submodule (between tags, built from source)."""
    return next((line for line in (log or "").splitlines() if line.startswith("note: 3rdparty/tvm-ffi")), None)


if __name__ == "__main__":
    main()
