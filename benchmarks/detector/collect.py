"""Record real trials of the C example to a JSON-lines file, judged later by any rule.

    nice -n 10 python -m benchmarks.detector.collect OUT.jsonl --pairs 100 --minutes 40

Each line is one trial: the treatment tag (``same`` for A/A, ``plus2`` ...), the layout,
and every process of both sides in run order with its samples and wall time, so a rule
can be replayed with the time the processes really took (the driver's time budget).
Trials of every tag are taken in turn, so each tag sees the same machine conditions.
The file is appended to; a second run adds trials.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from abwatch.runners.harness import CONTROL, interleaved_schedule
from benchmarks.detector.real import RealBench

TAGS = ("same", "plus2", "plus3", "plus5", "plus10")


def record(bench: RealBench, tag: str, pairs: int, seed: int) -> dict:
    """One interleaved trial of ``pairs`` processes a side, with wall times."""
    order = [s.side for s in interleaved_schedule(pairs, 0, random.Random(seed))]
    bench.runner.run(bench.paths["base"], bench.workload, 30)  # warm-up, discarded
    procs = []
    for side in order:
        result = bench.runner.run(bench.paths["base"] if side == CONTROL else bench.paths[tag], bench.workload, 30)
        if result.status != "ok":
            raise RuntimeError(f"benchmark failed: {result.message}")
        procs.append({"side": side, "samples": list(result.samples), "wall_s": result.wall_s})
    return {"tag": tag, "seed": seed, "pairs": pairs, "load": os.getloadavg()[0], "procs": procs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--aa-weight", type=int, default=3, help="A/A trials per round of the other tags")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--only", choices=TAGS, help="record trials of this tag only")
    args = parser.parse_args()
    bench = RealBench([2.0, 3.0, 5.0, 10.0])
    deadline = time.monotonic() + args.minutes * 60
    seed, rounds = args.seed, 0
    try:
        with open(args.out, "a") as out:
            while time.monotonic() < deadline:
                for tag in [args.only] if args.only else ("same",) * args.aa_weight + TAGS[1:]:
                    out.write(json.dumps(record(bench, tag, args.pairs, seed)) + "\n")
                    out.flush()
                    seed += 1
                rounds += 1
                print(f"round {rounds} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    finally:
        bench.close()


if __name__ == "__main__":
    main()
