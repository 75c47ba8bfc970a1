"""Interleaved against duet runs (on two CPUs and on one) on this host, in the same run: a made
+3 %, quiet and busy, and a memory-bound pair whose difference a duet shrinks.

    python -m benchmarks.duet --trials 6 --busy 2
    python -m benchmarks.duet --made 0 --busy 0 --memory-pairs 0   # A/A: false positives

A C program does a fixed amount of integer work (5 samples of ~20 ms a process); the treatment
does 3 % more. Each trial judges it the way ``abwatch compare`` does (the first look's pairs,
then the stopping rule, on wall time or under heavy contention on CPU time:
:func:`service.compare.contended.look`, at the service's defaults: threshold 1 %, 12 pairs
first, ``--max-seconds`` a trial), once interleaved, once as a duet (``[run] schedule =
"duet"``) and once as a duet on one CPU (``"duet-one-cpu"``, judged on CPU time), rotating which
goes first; then the same with ``--busy`` busy loops (``python3 -c "while 1: pass"``) beside it. Printed: verdict counts, median seconds to the verdict, the median
width of the final interval, the median change and pairs a minute.

Then the memory-bound pairs: a C program that streams an array (one load a cache line; the
treatment reads 10 % more of it), out of memory (256 MiB a pass) and out of the L3 cache (20
MiB, which fits this host's 32 MiB L3 alone but not beside the other side), measured in a fixed
number of pairs in each mode without busy loops. The change each mode measures against the
known +10 % is what a duet costs a memory-bound workload (docs/statistics.md, "Duet runs"); on
one CPU it is measured on each process's CPU time, as that schedule is judged.
Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners import CpuRunner
from abwatch.runners.duet import Cores, host_cores, measure_duet
from abwatch.runners.harness import interleaved_schedule, measure
from abwatch.service import stats
from abwatch.service.compare import contended
from abwatch.builders import TvmWheelBuilder
from benchmarks.load import busy_loops
from abwatch.service.config import (
    CommandWorkloadConfig, Config, RunnerConfig, TvmWheelBuildConfig, TvmWorkloadConfig, load_config,
)

SPIN = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    unsigned long x = 88172645463325252UL;
    for (int s = 0; s < 5; s++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long n = 0; n < WORK; n++) x = x * 6364136223846793005UL + 1442695040888963407UL;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("{\"runtime_ms\": %.6f}\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    return x == 12345 ? 1 : 0;  /* uses x, so the loop is not optimized away */
}
"""

STREAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
    unsigned long *a = malloc(SIZE * sizeof *a), sum = 0;  /* SIZE: the same allocation on both sides */
    for (long i = 0; i < SIZE; i++) a[i] = i;  /* touched: no page fault is timed */
    for (int s = 0; s < 5; s++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long p = 0; p < PASSES; p++)
            for (long i = 0; i < READ; i += 8) sum += a[i];  /* one load a cache line */
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("{\"runtime_ms\": %.6f}\n", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    return sum == 12345 ? 1 : 0;
}
"""

COMPILE_S = 900.0  # a TVM side's first invocation compiles its library
SPIN_WORK = 20_000_000  # ~20 ms a sample on this machine
# The memory-bound pairs: the control reads READ uint64s a pass, the treatment 10 % more.
# "dram": 256 MiB a pass, far beyond any cache; "l3": 20 MiB, 20 passes a sample, which fits this
# host's 32 MiB L3 alone but not beside the other side's 22 MiB.
MEMORY = {"dram": {"SIZE": 36 << 20, "READ": 32 << 20, "PASSES": 1},
          "l3": {"SIZE": 11 << 18, "READ": 10 << 18, "PASSES": 20}}


def build(where: Path, name: str, source: str, **defines: int) -> Path:
    """``source`` compiled with ``defines`` as ``./bench`` in a directory of its own."""
    out = where / name
    out.mkdir()
    out.chmod(0o755)  # measured processes run as the sandbox's user
    (out / "bench.c").write_text(source)
    flags = [f"-D{k}={v}L" for k, v in defines.items()]  # long constants
    subprocess.run(["cc", "-O2", *flags, "-o", str(out / "bench"), str(out / "bench.c")], check=True)
    return out


def service_config(where: Path, max_seconds: float, contention_share: float) -> Config:
    """The service's defaults (``[run]``, ``[stats]``), with ``max_seconds`` a trial and
    ``contention_share`` (0: every look on wall time, however contended)."""
    path = where / "abwatch.toml"
    path.write_text(f'[repo]\nurl = "{where}"\n[build]\nkind = "command"\ncommand = ["true"]\n'
                    f'[[workloads]]\nname = "w"\nkind = "command"\ncommand = ["./bench"]\n'
                    f"[run]\nmax_seconds = {max_seconds}\nseed = 1\n[stats]\ncontention_share = {contention_share}\n")
    return load_config(path)


def modes(cores: Cores) -> dict[str, Cores | None]:
    """The schedules compared, by name: each one's cores (None: interleaved)."""
    return {"interleaved": None, "duet": cores, "duet-one-cpu": host_cores("duet-one-cpu")}


def rotated(names: list[str], t: int) -> list[str]:
    """``names`` in trial ``t``'s order: each goes first as often."""
    return names[t % len(names):] + names[:t % len(names)]


def trial(runner, workload, dirs, config: Config, cores: Cores | None, seed: int) -> dict:
    """One comparison as the driver takes it (:func:`service.compare.driver._measure_workload`
    without the database): interleaved, or a duet on ``cores`` (on one CPU: judged on CPU time)."""
    rng = random.Random(seed)
    paths = {CONTROL: dirs[CONTROL], TREATMENT: dirs[TREATMENT]}
    budget = stats.Budget(max_seconds=config.run.max_seconds, max_pairs=None, batch=config.run.step)
    first = config.run.repetitions
    schedule = interleaved_schedule(first, config.run.warmup, rng)
    started, look, m = time.monotonic(), 0, None
    while True:
        if cores is not None:
            m = measure_duet(runner, paths, workload, schedule, 60, lambda *_: None, cores, into=m)
        else:
            m = measure(runner, paths, workload, schedule, 60, lambda *_: None, into=m)
        if m.failure:
            raise RuntimeError(m.failure)
        look += 1
        step = contended.look(m, config, look=look, elapsed_s=time.monotonic() - started, budget=budget,
                              seed=seed, plan_pairs=max(first, stats.DEFAULT_PLAN_PAIRS),
                              one_cpu=cores is not None and cores.one_cpu)
        if step.stop:
            v = step.verdict
            pairs = len(m.processes[CONTROL])
            elapsed = time.monotonic() - started
            return {"verdict": v.verdict.value, "seconds": elapsed, "pairs": pairs, "change": v.change_pct,
                    "width": (v.ci_pct[1] - v.ci_pct[0]) if v.ci_pct else None, "unit": v.unit}
        schedule = interleaved_schedule(step.next_pairs, 0, rng, start=schedule[-1].position + 1)


def fixed(runner, workload, dirs, cores: Cores | None, pairs: int, seed: int) -> float | None:
    """The change ``pairs`` pairs measure (paired process minima, as the service estimates it; on
    one CPU, paired processes' CPU times)."""
    rng = random.Random(seed)
    paths = {CONTROL: dirs[CONTROL], TREATMENT: dirs[TREATMENT]}
    schedule = interleaved_schedule(pairs, 1, rng)
    m = (measure_duet(runner, paths, workload, schedule, 120, lambda *_: None, cores) if cores is not None
         else measure(runner, paths, workload, schedule, 120, lambda *_: None))
    if m.failure:
        raise RuntimeError(m.failure)
    values, groups = contended.on_cpu(m, False) if cores is not None and cores.one_cpu else (m.samples, m.groups)
    v = stats.compare(values[CONTROL], values[TREATMENT], threshold_pct=1.0, control_groups=groups[CONTROL],
                      treatment_groups=groups[TREATMENT], paired=True)
    return v.change_pct


def summary(rows: list[dict]) -> str:
    """One table row's figures: verdicts, median seconds, interval width, change, pairs a minute."""
    counts = Counter(r["verdict"] for r in rows)
    med = lambda key: statistics.median(r[key] for r in rows if r[key] is not None)  # noqa: E731
    pairs_min = statistics.median(60 * r["pairs"] / r["seconds"] for r in rows)
    cpu = sum(r["unit"] != "ms" for r in rows)
    return (f"{', '.join(f'{k} {n}' for k, n in sorted(counts.items()))} | {med('seconds'):.1f} | "
            f"{med('width'):.2f} | {med('change'):+.2f} | {pairs_min:.0f} | {cpu}")


def tvm_trials(runner, cores: Cores, args) -> None:
    """A made +3 % on a TVM workload (the treatment's matmul 3 % larger), interleaved against duets:
    each pair's processes are fresh TVM workers, most of whose time is starting and importing TVM."""
    workload = TvmWorkloadConfig(name="matmul", model="te:matmul", options={"m": 96, "k": 96, "n": 96},
                                 treatment_options={"options": {"n": 99}})
    base = Config(build=TvmWheelBuildConfig(), cache_dir=args.tvm, workloads=[workload])
    artifact = TvmWheelBuilder(base).build("0.27.0.post1").path
    with tempfile.TemporaryDirectory() as tmp:
        config = service_config(Path(tmp), args.max_seconds, 0.0 if args.wall_only else 0.5)
        dirs = {CONTROL: artifact, TREATMENT: artifact}
        schedules = modes(cores)
        rows: dict[str, list[dict]] = {mode: [] for mode in schedules}
        # the first compile of each side, outside the trials' times
        runner.run(artifact, workload, COMPILE_S, CONTROL)
        runner.run(artifact, workload, COMPILE_S, TREATMENT)
        with busy_loops(args.busy):
            for t in range(args.trials):
                for mode in rotated(list(schedules), t):
                    rows[mode].append(trial(runner, workload, dirs, config, schedules[mode], t))
                    print(f"  tvm {mode} {t}: {rows[mode][-1]}", file=sys.stderr, flush=True)
    print(f"\nte:matmul 96x96x96, treatment n = 99 (+3.1 %), one thread, TVM 0.27.0.post1, {args.busy} busy loops, "
          f"{args.trials} trials a mode")
    print("| mode | verdicts | median s to verdict | median CI width (pp) | median change | pairs/min | judged on CPU time |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode, found in rows.items():
        print(f"| {mode} | {summary(found)} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="comparisons a mode, quiet and busy each")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the busy trials (0: none)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="a trial's budget (run.max_seconds)")
    parser.add_argument("--memory-pairs", type=int, default=20, help="pairs a memory-bound measurement (0: none)")
    parser.add_argument("--memory-trials", type=int, default=4)
    parser.add_argument("--made", type=float, default=3.0, help="the treatment's extra work, %% (0: an A/A run)")
    parser.add_argument("--tvm", type=Path, metavar="CACHE_DIR",
                        help="instead: te:matmul on TVM 0.27.0.post1 (built under CACHE_DIR), its treatment "
                             "3 %% larger (treatment_options), --trials a mode, with --busy loops beside it")
    parser.add_argument("--wall-only", action="store_true",
                        help="judge wall time at every look (stats.contention_share = 0), not CPU time under contention")
    args = parser.parse_args()
    cores = host_cores()
    runner = CpuRunner(RunnerConfig(device="duet-benchmark", threads=1))
    if args.tvm:
        tvm_trials(runner, cores, args)
        runner.teardown()
        return
    spin = CommandWorkloadConfig(name="spin", command=["./bench"])
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        where.chmod(0o755)
        config = service_config(where, args.max_seconds, 0.0 if args.wall_only else 0.5)
        dirs = {CONTROL: build(where, "spin-c", SPIN, WORK=SPIN_WORK),
                TREATMENT: build(where, "spin-t", SPIN, WORK=int(SPIN_WORK * (1 + args.made / 100)))}
        print(f"cores {cores.describe()}", flush=True)
        if args.trials:
            print(f"\n{args.made:+g} % made, threshold {config.stats.threshold_pct:g} %, {args.trials} trials a mode, "
                  + ("wall time at every look" if args.wall_only else "CPU time under heavy contention"))
            print("| host | mode | verdicts | median s to verdict | median CI width (pp) | median change | "
                  "pairs/min | judged on CPU time |")
            print("|---|---|---|---:|---:|---:|---:|---:|")
        for busy in ((0, args.busy) if args.busy else (0,)) if args.trials else ():
            with busy_loops(busy):
                schedules = modes(cores)
                rows: dict[str, list[dict]] = {mode: [] for mode in schedules}
                for t in range(args.trials):
                    for mode in rotated(list(schedules), t):
                        rows[mode].append(trial(runner, spin, dirs, config, schedules[mode], t))
                        print(f"  {busy} busy {mode} {t}: {rows[mode][-1]}", file=sys.stderr,
                              flush=True)
                for mode, found in rows.items():
                    host = f"{busy} busy loops" if busy else "no busy loops"
                    print(f"| {host} | {mode} | {summary(found)} |", flush=True)
        if args.memory_pairs:
            stream = CommandWorkloadConfig(name="stream", command=["./bench"])
            print(f"\nmemory-bound pairs (+10 % made, {args.memory_pairs} pairs x {args.memory_trials} trials, "
                  "no busy loops): the change measured (paired process minima)")
            print("| working set | mode | changes measured | median |")
            print("|---|---|---|---:|")
            for name, sizes in MEMORY.items():
                mdirs = {CONTROL: build(where, f"{name}-c", STREAM, **sizes),
                         TREATMENT: build(where, f"{name}-t", STREAM, **dict(sizes, READ=int(sizes["READ"] * 1.1)))}
                schedules = modes(cores)
                changes: dict[str, list[float]] = {mode: [] for mode in schedules}
                for t in range(args.memory_trials):
                    for mode in rotated(list(schedules), t):
                        change = fixed(runner, stream, mdirs, schedules[mode], args.memory_pairs, t)
                        if change is not None:
                            changes[mode].append(change)
                        print(f"  memory {name} {mode} {t}: {change}", file=sys.stderr, flush=True)
                for mode, found in changes.items():
                    print(f"| {name} | {mode} | {', '.join(f'{c:+.1f} %' for c in found)} | "
                          f"{statistics.median(found):+.1f} % |" if found else f"| {name} | {mode} | - | - |",
                          flush=True)
    runner.teardown()


if __name__ == "__main__":
    main()
