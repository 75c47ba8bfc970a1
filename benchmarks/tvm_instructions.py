"""TVM compile time against compile instructions, side by side in one run, on this machine.

    bash benchmarks/busy_compile.sh & LOAD=$!
    python -m benchmarks.tvm_instructions --out /tmp/tvm-instr.jsonl
    kill $LOAD

For each pair (an A/A of 0.27.0.post1, and 0.26.0 -> 0.27.0.post1) and each workload of
``config/tvm-example.toml`` (MLP, CNN, TE matmul), the driver's own measuring loops run one
after the other on the same builds:

* **compile time**: :func:`service.compare.compile_time.measure` (fresh-process compiles,
  interleaved, the config's ``compile_repetitions`` and ``max_seconds``);
* **compile instructions**: :func:`service.compare.instructions.measure` with
  ``what="compile"`` (the compile call counted, ``run.counted_jobs`` processes at once).

One JSON line per (pair, workload, metric) and a table: verdict, change, interval, pairs and
seconds to the verdict. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.builders import TvmWheelBuilder
from abwatch.runners import CpuRunner
from abwatch.service.compare import compile_time, instructions
from abwatch.service.compare.progress import NullProgress
from abwatch.service.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAIRS = (("0.27.0.post1", "0.27.0.post1"), ("0.26.0", "0.27.0.post1"))


def measure(config, runner, artifacts, workload, seed: int) -> list[dict]:
    """Both metrics of one workload's compile on one pair of builds."""
    rows = []
    for metric in ("compile time", "compile instructions"):
        rng = random.Random(seed)
        started = time.monotonic()
        if metric == "compile time":
            judged = compile_time.measure(runner, workload, artifacts, config, seed, rng, NullProgress(), 900)
        else:
            judged = instructions.measure(runner, workload, artifacts, config, seed, rng, NullProgress(), 900,
                                          what="compile")
        assert judged is not None  # both are asked for by the config
        v = judged.verdict
        rows.append({"workload": workload.name, "metric": metric, "verdict": v.verdict.value,
                     "change_pct": v.change_pct, "ci_pct": v.ci_pct, "pairs": len(judged.samples[CONTROL]),
                     "seconds": round(time.monotonic() - started, 1), "failure": judged.failure,
                     "source": getattr(judged, "source", "clock"), "load": os.getloadavg()[0],
                     "control": judged.samples[CONTROL], "treatment": judged.samples[TREATMENT]})
    return rows


def table(rows: list[dict]) -> None:
    """The rows as a markdown table."""
    print("| pair | workload | metric | verdict | change | interval | pairs | s to verdict | load |")
    print("|---|---|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        ci = "-" if not r["ci_pct"] else f"{r['ci_pct'][0]:+.3f} .. {r['ci_pct'][1]:+.3f} %"
        change = "-" if r["change_pct"] is None else f"{r['change_pct']:+.3f} %"
        print(f"| {r['pair']} | {r['workload']} | {r['metric']} | {r['verdict']} | {change} | {ci} | "
              f"{r['pairs']} | {r['seconds']:.0f} | {r['load']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config" / "tvm-example.toml"))
    parser.add_argument("--workloads", nargs="*", help="names (default: all of the config's)")
    parser.add_argument("--out", help="append each row as a JSON line here")
    parser.add_argument("--summarize", help="print the table of an earlier --out file and exit")
    args = parser.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            table([json.loads(line) for line in f])
        return
    config = load_config(args.config)
    workloads = [w.model_copy(update={"measure": ["time", "instructions"]}) for w in config.workloads
                 if not args.workloads or w.name in args.workloads]
    runner = CpuRunner(config.runner)
    builder = TvmWheelBuilder(config)
    rows = []
    try:
        for control, treatment in PAIRS:
            artifacts = {CONTROL: builder.build(control).path, TREATMENT: builder.build(treatment).path}
            for workload in workloads:
                for row in measure(config, runner, artifacts, workload, seed=len(rows)):
                    row["pair"] = f"{control} -> {treatment}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    finally:
        runner.teardown()
    table(rows)


if __name__ == "__main__":
    main()
