"""Record real trials of the C example to a JSON-lines file, judged later by any rule.

    nice -n 10 python -m benchmarks.detector.collect OUT.jsonl --pairs 100 --minutes 40
    nice -n 10 python -m benchmarks.detector.collect OUT.jsonl --until-decided --budget-s 120

Each line is one trial: the treatment tag (``same`` for A/A, ``plus2`` ...), the layout,
and every process of both sides in run order with its samples and wall time, so a rule
can be replayed with the time the processes really took (the driver's time budget).
Trials of every tag are taken in turn, so each tag sees the same machine conditions.
The file is appended to; a second run adds trials.

``--until-decided`` makes each trial a real run of abwatch's rule: pairs are measured in
the driver's batches (12, then what :func:`stats.sequential_look` asks for) until the rule
stops (decided, or the next pair would not fit into ``--budget-s`` at the pace measured),
and never fewer than ``--min-pairs`` (so the anchors' fixed sample sizes can be replayed).
Replaying such a file with the same budget reproduces each run's own verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from abwatch.core.sides import CONTROL
from abwatch.runners.harness import interleaved_schedule
from abwatch.service import stats
from benchmarks.detector.real import RealBench

TAGS = ("same", "plus2", "plus3", "plus5", "plus10")


def _measure(bench: RealBench, tag: str, order: list[str], procs: list[dict]) -> None:
    """Run the processes of ``order`` (sides), appending each one's samples and wall time."""
    for side in order:
        result = bench.runner.run(bench.paths["base"] if side == CONTROL else bench.paths[tag], bench.workload, 30)
        if result.status != "ok":
            raise RuntimeError(f"benchmark failed: {result.message}")
        procs.append({"side": side, "samples": list(result.samples), "wall_s": result.wall_s})


def record(bench: RealBench, tag: str, pairs: int, seed: int) -> dict:
    """One interleaved trial of ``pairs`` processes a side, with wall times."""
    order = [s.side for s in interleaved_schedule(pairs, 0, random.Random(seed))]
    bench.runner.run(bench.paths["base"], bench.workload, 30)  # warm-up, discarded
    procs: list[dict] = []
    _measure(bench, tag, order, procs)
    return {"tag": tag, "seed": seed, "pairs": pairs, "load": os.getloadavg()[0], "procs": procs}


def _judge(procs: list[dict], look: int, budget: stats.Budget) -> stats.Look:
    """The driver's stopping rule on the processes so far; elapsed time is the pairs' wall
    time, exactly as ``benchmarks.detector`` replays it."""
    sides: dict[str, list[dict]] = {"control": [], "treatment": []}
    for p in procs:
        sides["control" if p["side"] == CONTROL else "treatment"].append(p)
    pairs = min(len(sides["control"]), len(sides["treatment"]))
    a = [x for p in sides["control"][:pairs] for x in p["samples"]]
    b = [x for p in sides["treatment"][:pairs] for x in p["samples"]]
    ga = [i for i, p in enumerate(sides["control"][:pairs]) for _ in p["samples"]]
    gb = [i for i, p in enumerate(sides["treatment"][:pairs]) for _ in p["samples"]]
    elapsed = sum(c["wall_s"] + t["wall_s"] for c, t in zip(sides["control"][:pairs], sides["treatment"][:pairs], strict=False))
    return stats.sequential_look(a, b, ga, gb, look=look, elapsed_s=elapsed, budget=budget,
                                 plan_pairs=max(stats.DEFAULT_PLAN_PAIRS, START))


START, STEP = 12, 6  # the driver's defaults: run.repetitions and half of it a look


def record_until_decided(bench: RealBench, tag: str, seed: int, budget_s: float, min_pairs: int) -> dict:
    """One trial that runs as the driver runs a workload: batches until abwatch's rule stops
    (decided or out of time), measured on at least ``min_pairs`` pairs."""
    rng = random.Random(seed)
    budget = stats.Budget(max_seconds=budget_s, batch=STEP)
    bench.runner.run(bench.paths["base"], bench.workload, 30)  # warm-up, discarded
    procs: list[dict] = []
    batch, look, stop_reason = START, 0, None
    while batch:
        _measure(bench, tag, [s.side for s in interleaved_schedule(batch, 0, rng)], procs)
        pairs = len(procs) // 2
        if stop_reason is None:
            look += 1
            step = _judge(procs, look, budget)
            if step.stop:
                stop_reason = step.verdict.stop_reason
        batch = 0 if stop_reason and pairs >= min_pairs else (STEP if stop_reason else step.next_pairs)
    return {"tag": tag, "seed": seed, "pairs": len(procs) // 2, "load": os.getloadavg()[0], "procs": procs,
            "stop_reason": stop_reason}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--aa-weight", type=int, default=3, help="A/A trials per round of the other tags")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--only", choices=TAGS, help="record trials of this tag only")
    parser.add_argument("--until-decided", action="store_true",
                        help="run each trial as the driver would, until abwatch's rule stops")
    parser.add_argument("--budget-s", type=float, default=120.0, help="time budget per trial (--until-decided)")
    parser.add_argument("--min-pairs", type=int, default=36, help="fewest pairs a trial records (--until-decided)")
    args = parser.parse_args()
    bench = RealBench([2.0, 3.0, 5.0, 10.0])
    deadline = time.monotonic() + args.minutes * 60
    seed, rounds = args.seed, 0
    try:
        with open(args.out, "a") as out:
            while time.monotonic() < deadline:
                for tag in [args.only] if args.only else ("same",) * args.aa_weight + TAGS[1:]:
                    row = (record_until_decided(bench, tag, seed, args.budget_s, args.min_pairs)
                           if args.until_decided else record(bench, tag, args.pairs, seed))
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    seed += 1
                rounds += 1
                print(f"round {rounds} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    finally:
        bench.close()


if __name__ == "__main__":
    main()
