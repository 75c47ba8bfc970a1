"""How much CPU time moves on a contended host, against wall time: the detector's C workloads.

    python -m benchmarks.cpu_time --spinners 2 --pairs 16 --trials 3
    python -m benchmarks.cpu_time --spinners 8 --pairs 16 --trials 3

The C benchmark built at base work and at +5 % (benchmarks.detector.real) runs in abwatch's
interleaved order through the CPU runner (sandboxed, as the driver runs it) while
``--spinners`` busy processes compete for the CPUs. Each process gives its timed samples
(wall time of the timed region) and its CPU time (user + system, from wait4 inside the
sandbox). For each trial it prints both verdicts of the +5 % change and of an A/A pair: wall
time judged as the driver judges it (each process's samples), and the ``cpu_time`` metric
judged as the metric registry judges it (one value per process, paired) — the change, the
interval's width and the processes' spread. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import time

from abwatch.core.sides import CONTROL
from abwatch.runners.harness import interleaved_schedule
from abwatch.service import stats
from benchmarks.detector.real import RealBench


def _spin() -> None:
    while True:
        pass


def trial(bench: RealBench, tag: str, pairs: int, seed: int) -> dict:
    """One interleaved trial of base against ``tag``: both verdicts and the spreads."""
    schedule = interleaved_schedule(pairs, 0, random.Random(seed))
    bench.runner.run(bench.paths["base"], bench.workload, 30)  # warm-up, discarded
    samples: dict[str, list[float]] = {"control": [], "treatment": []}
    groups: dict[str, list[int]] = {"control": [], "treatment": []}
    cpu: dict[str, list[float]] = {"control": [], "treatment": []}
    walls: dict[str, list[float]] = {"control": [], "treatment": []}
    for slot in schedule:
        result = bench.runner.run(bench.paths["base" if slot.side == CONTROL else tag], bench.workload, 30)
        if result.status != "ok" or result.cpu_s is None:
            raise RuntimeError(f"benchmark failed: {result.message or 'no CPU time'}")
        samples[slot.side] += result.samples
        groups[slot.side] += [slot.position] * len(result.samples)
        cpu[slot.side].append(1000.0 * result.cpu_s)
        walls[slot.side].append(result.wall_s)
    wall_v = stats.compare(samples["control"], samples["treatment"], control_groups=groups["control"],
                           treatment_groups=groups["treatment"], paired=True, threshold_pct=1.0, seed=seed)
    positions = {side: sorted(set(groups[side])) for side in groups}
    cpu_v = stats.compare(cpu["control"], cpu["treatment"], control_groups=positions["control"],
                          treatment_groups=positions["treatment"], paired=True, threshold_pct=1.0, seed=seed,
                          min_samples=3)

    def width(v: stats.Verdict) -> float | None:
        return None if v.ci_pct is None else round(v.ci_pct[1] - v.ci_pct[0], 2)

    share = statistics.median(c / 1000.0 / w for side in cpu for c, w in zip(cpu[side], walls[side], strict=True))
    return {"tag": tag, "pairs": pairs, "load": round(os.getloadavg()[0], 1), "cpu_share": round(share, 2),
            # what each figure of the control's processes was: how far load moves each
            "control_process_wall_ms": round(1000 * statistics.median(walls["control"]), 2),
            "control_process_cpu_ms": round(statistics.median(cpu["control"]), 2),
            "control_sample_ms": round(statistics.median(samples["control"]), 3),
            "wall": {"verdict": wall_v.verdict.value, "change_pct": round(wall_v.change_pct or 0, 2),
                     "ci_width_pct": width(wall_v)},
            "cpu_time": {"verdict": cpu_v.verdict.value, "change_pct": round(cpu_v.change_pct or 0, 2),
                         "ci_width_pct": width(cpu_v),
                         "cv_pct": round(100 * statistics.stdev(cpu["control"]) / statistics.mean(cpu["control"]), 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spinners", type=int, default=0, help="busy processes beside the benchmark")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    bench = RealBench([5.0])
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.spinners)]
    for p in spinners:
        p.start()
    time.sleep(45)  # let the (one-minute) load average see them
    rows = []
    try:
        for seed in range(args.trials):
            for tag in ("same", "plus5"):
                row = trial(bench, tag, args.pairs, seed)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for p in spinners:
            p.terminate()
        bench.close()
    print("\n| spinners | load | CPU share | change | process wall ms | process CPU ms | sample ms | wall: verdict, "
          "change, CI width | cpu_time: verdict, change, CI width, CV |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        w, c = r["wall"], r["cpu_time"]
        print(f"| {args.spinners} | {r['load']} | {r['cpu_share']} | {r['tag']} | {r['control_process_wall_ms']} | "
              f"{r['control_process_cpu_ms']} | {r['control_sample_ms']} | {w['verdict']} {w['change_pct']:+.2f} %, "
              f"{w['ci_width_pct']} | {c['verdict']} {c['change_pct']:+.2f} %, {c['ci_width_pct']}, {c['cv_pct']} % |")


if __name__ == "__main__":
    main()
