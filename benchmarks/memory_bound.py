"""What instructions miss: a change that moves memory traffic, not work.

    python -m benchmarks.memory_bound --trials 10

One C program chases pointers around a random cycle of 4096 slots, 5 samples of 200,000
loads a process. The control packs the slots together (32 KiB: the L1/L2 cache); the
treatment spaces them 4096 slots apart (128 MiB: a cache and TLB miss a load). Both execute
the same instructions — only an immediate differs — so a counter sees no change while the
clock sees the program slow down several times. Each trial judges 8 counted pairs and 8
timed pairs with the service's rule (:func:`stats.sequential_look`, threshold 0.5 %) and
prints both verdicts. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import tempfile
from pathlib import Path

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners import CpuRunner
from abwatch.runners.counters import choose
from abwatch.runners.harness import interleaved_schedule
from abwatch.service import stats
from abwatch.service.config import CommandWorkloadConfig, RunnerConfig

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define K 4096
int main(void) {
    size_t *a = calloc((size_t)K * 4096, sizeof(size_t));  /* the same allocation on both sides */
    size_t order[K];
    unsigned long x = 88172645463325252UL;
    for (size_t i = 0; i < K; i++) order[i] = i;
    for (size_t i = K - 1; i > 0; i--) {  /* a seeded shuffle: one cycle through every slot */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t j = x % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t;
    }
    for (size_t i = 0; i < K; i++) a[order[i] * SPACING] = order[(i + 1) % K] * SPACING;
    size_t p = 0;
    for (int s = 0; s < 5; s++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long n = 0; n < 200000; n++) p = a[p];
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("{\"runtime_ms\": %.6f}\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    return p == 12345678 ? 1 : 0;  /* uses p, so the chase is not optimized away */
}
"""


def build(where: Path, spacing: int) -> Path:
    """The program with ``SPACING`` slots between neighbours, in its own directory."""
    out = where / f"s{spacing}"
    out.mkdir()
    (out / "chase.c").write_text(SOURCE)
    subprocess.run(["cc", "-O2", f"-DSPACING={spacing}", "-o", str(out / "chase"), str(out / "chase.c")], check=True)
    return out


def judge(runner, workload, dirs, counter, rng) -> dict:
    """One trial: 8 counted pairs and 8 timed pairs, each judged once."""
    verdicts = {}
    for metric in ("instructions", "time"):
        samples: dict[str, list[float]] = {CONTROL: [], TREATMENT: []}
        groups: dict[str, list[int]] = {CONTROL: [], TREATMENT: []}
        for slot in interleaved_schedule(8, 0, rng):
            result = (runner.count_instructions(dirs[slot.side], workload, 120, counter, slot.side)
                      if metric == "instructions" else runner.run(dirs[slot.side], workload, 60))
            if result.status != "ok":
                raise RuntimeError(f"{metric} process failed: {result.message}")
            samples[slot.side].extend(result.samples)
            groups[slot.side].extend([slot.position] * len(result.samples))
        v = stats.sequential_look(samples[CONTROL], samples[TREATMENT], groups[CONTROL], groups[TREATMENT],
                                  look=1, elapsed_s=0.0, threshold_pct=0.5,
                                  budget=stats.Budget(max_seconds=3600, max_pairs=8, batch=2)).verdict
        verdicts[metric] = (v.verdict.value, v.change_pct)
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--counter", default="auto")
    args = parser.parse_args()
    counter = choose(args.counter)
    runner = CpuRunner(RunnerConfig(device="memory-bound"))
    workload = CommandWorkloadConfig(name="chase", command=["./chase"])
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {CONTROL: build(Path(tmp), 1), TREATMENT: build(Path(tmp), 4096)}
        rows = [judge(runner, workload, dirs, counter, random.Random(trial)) for trial in range(args.trials)]
    print("| metric | trials | verdicts | median change |")
    print("|---|---:|---|---:|")
    for metric in ("instructions", "time"):
        found: dict[str, int] = {}
        for row in rows:
            found[row[metric][0]] = found.get(row[metric][0], 0) + 1
        changes = sorted(row[metric][1] for row in rows if row[metric][1] is not None)
        median = f"{changes[len(changes) // 2]:+.3f} %" if changes else "-"
        print(f"| {metric} ({counter.name if metric == 'instructions' else 'clock'}) | {len(rows)} | "
              f"{', '.join(f'{k} {n}' for k, n in sorted(found.items()))} | {median} |")


if __name__ == "__main__":
    main()
