"""Instructions against wall time on the detector suite's C workloads, side by side in one run.

    nice -n 10 python -m benchmarks.instructions --trials 25 --out /tmp/instr.jsonl

The C benchmark (``benchmarks.detector.real``: a dependent multiply-add loop, ~2 ms a sample,
5 samples a process) is built at its base work, again unchanged (``same``, the no-op), and
with +0.5, +1 and +2 % more work. Each trial compares base with one tag, the tags in turn:

* **instructions**: counted processes (``runners.counters``; Valgrind here), interleaved,
  judged by the service's own loop (:func:`service.compare.fresh.until_decided`: the rule
  after ``--first`` pairs, the service's first look
  :data:`service.compare.instructions.FIRST_LOOK`, and every 2 more, up to 12 pairs) at
  ``--threshold``, one process at a time;
* **time**: as many timed pairs as instructions used, judged once by the same rule at the
  same threshold and the same fewest pairs (what wall time says for the same number of
  processes).

A verdict is *right* when it is ``regression`` for a tag with more work and ``same`` for the
no-op. One JSON line per trial; a table at the end: right %, verdicts, median pairs and
median seconds to the verdict per tag and metric, how far the base's count moved across the
trials (and the load they ran at), and Valgrind's slowdown over the native process.
Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.counters import choose
from abwatch.runners.results import InvocationResult
from abwatch.runners.harness import Slot, interleaved_schedule
from abwatch.service import stats
from abwatch.service.compare import fresh
from abwatch.service.compare.instructions import FIRST_LOOK
from benchmarks.detector.real import RealBench

TAGS = ("same", "plus0.5", "plus1", "plus2")
MOST = 12


def _judge(samples: dict, groups: dict, elapsed: float, threshold: float, pairs: int, first: int) -> stats.Look:
    """One look of the rule at ``pairs`` timed pairs, with the counted loop's fewest pairs."""
    return stats.sequential_look(samples[CONTROL], samples[TREATMENT], groups[CONTROL], groups[TREATMENT],
                                 look=1, elapsed_s=elapsed, threshold_pct=threshold,
                                 budget=stats.Budget(max_seconds=3600, max_pairs=pairs, batch=fresh.BATCH),
                                 min_pairs=first, min_samples=min(first, stats.MIN_SAMPLES))


def counted(bench: RealBench, counter, tag: str, rng: random.Random, threshold: float, first: int) -> dict:
    """Instructions: counted pairs, one process at a time, until the rule stops (the service's
    own loop, :func:`service.compare.fresh.until_decided`)."""
    walls: list[float] = []

    def count(slot: Slot) -> InvocationResult:
        path = bench.paths["base"] if slot.side == CONTROL else bench.paths[tag]
        result = bench.runner.count_instructions(path, bench.workload, 120, counter, slot.side)
        walls.append(result.wall_s)
        return result

    rule = fresh.Rule(threshold, stats.DEFAULT_ALPHA, stats.DEFAULT_CONFIDENCE, stats.DEFAULT_EQUIVALENCE_ALPHA,
                      first, MOST, 3600, seed=0)
    judged = fresh.until_decided(count, rule, rng, "counted process")
    if judged.verdict is None:
        raise RuntimeError(judged.failure)
    v = judged.verdict
    return {"verdict": v.verdict.value, "change_pct": v.change_pct, "ci_pct": v.ci_pct,
            "pairs": len(judged.samples[CONTROL]), "seconds": round(judged.elapsed_s, 2),
            "base_counts": sorted(set(int(c) for c in judged.samples[CONTROL])),
            "process_s": statistics.median(walls)}


def timed(bench: RealBench, tag: str, pairs: int, rng: random.Random, threshold: float, first: int) -> dict:
    """Wall time: ``pairs`` timed pairs, judged once."""
    samples: dict[str, list[float]] = {CONTROL: [], TREATMENT: []}
    groups: dict[str, list[int]] = {CONTROL: [], TREATMENT: []}
    spent, walls = 0.0, []
    for slot in interleaved_schedule(pairs, 0, rng):
        path = bench.paths["base"] if slot.side == CONTROL else bench.paths[tag]
        result = bench.runner.run(path, bench.workload, 60)
        if result.status != "ok":
            raise RuntimeError(f"timed process failed: {result.message}")
        samples[slot.side].extend(result.samples)
        groups[slot.side].extend([slot.position] * len(result.samples))
        spent += result.wall_s
        walls.append(result.wall_s)
    v = _judge(samples, groups, spent, threshold, pairs, first).verdict
    return {"verdict": v.verdict.value, "change_pct": v.change_pct, "ci_pct": v.ci_pct, "pairs": pairs,
            "seconds": round(spent, 2), "process_s": statistics.median(walls)}


def right(tag: str, verdict: str) -> bool:
    """The ground truth: more work is a regression, the no-op is the same."""
    return verdict == ("same" if tag == "same" else "regression")


def summary(rows: list[dict]) -> None:
    """The table of the trials in ``rows``."""
    print(f"first look: {', '.join(str(f) for f in sorted({r.get('first', 8) for r in rows}))} pairs\n")
    print("| change | metric | trials | right | verdicts | median pairs | median s to verdict |")
    print("|---|---|---|---|---|---|---|")
    for tag in TAGS:
        mine = [r for r in rows if r["tag"] == tag]
        if not mine:
            continue
        for metric in ("instructions", "time"):
            verdicts = Counter(r[metric]["verdict"] for r in mine)
            ok = sum(right(tag, r[metric]["verdict"]) for r in mine)
            shown = ", ".join(f"{k} {n}" for k, n in verdicts.most_common())
            print(f"| {tag} | {metric} | {len(mine)} | {100 * ok / len(mine):.0f} % | {shown} | "
                  f"{statistics.median(r[metric]['pairs'] for r in mine):g} | "
                  f"{statistics.median(r[metric]['seconds'] for r in mine):.1f} |")
    slower = [r for r in rows if r["time"]["verdict"] == "regression"]
    missed = [r for r in slower if r["instructions"]["verdict"] != "regression"]
    print(f"\nwall-time regressions: {len(slower)}; instructions missed {len(missed)} of them"
          + (f" ({', '.join(sorted({r['tag'] for r in missed}))})" if missed else ""))
    counts = sorted({c for r in rows for c in r["instructions"]["base_counts"]})
    loads = [r["load"] for r in rows]
    print(f"\nbase process instructions over {len(rows)} trials at load {min(loads):.1f}-{max(loads):.1f}: "
          f"{len(counts)} distinct value(s), {counts[0]:,}..{counts[-1]:,} "
          f"(spread {100 * (counts[-1] - counts[0]) / counts[0]:.4f} %)")
    native = statistics.median(r["time"]["process_s"] for r in rows)
    counted_s = statistics.median(r["instructions"]["process_s"] for r in rows)
    print(f"process wall: native {native * 1000:.0f} ms, counted {counted_s * 1000:.0f} ms "
          f"({counted_s / native:.0f}x, start-up included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=25, help="trials per tag")
    parser.add_argument("--threshold", type=float, default=0.25, help="threshold (%%) for both metrics")
    parser.add_argument("--counter", default="auto")
    parser.add_argument("--first", type=int, default=FIRST_LOOK, help="pairs at the first look (default: the service's)")
    parser.add_argument("--out", help="append each trial as a JSON line here")
    parser.add_argument("--summarize", help="print the table of an earlier --out file and exit")
    args = parser.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            summary([json.loads(line) for line in f])
        return
    counter = choose(args.counter)
    bench = RealBench([0.5, 1, 2])
    rows = []
    try:
        for trial in range(args.trials):
            for tag in TAGS:
                rng = random.Random(trial * 100 + TAGS.index(tag))
                started = time.monotonic()
                instructions = counted(bench, counter, tag, rng, args.threshold, args.first)
                wall = timed(bench, tag, instructions["pairs"], rng, args.threshold, args.first)
                row = {"trial": trial, "tag": tag, "first": args.first, "load": os.getloadavg()[0], "counter": counter.name,
                       "instructions": instructions, "time": wall, "wall_s": round(time.monotonic() - started, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    finally:
        bench.close()
    summary(rows)


if __name__ == "__main__":
    main()
