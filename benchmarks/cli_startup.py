"""How long ``abwatch`` takes to start: CPU (user + system) and wall time of fresh processes.

    python -m benchmarks.cli_startup [--runs 7] [--db sqlite:///...]

Runs ``abwatch --version``, ``--help``, ``regressions`` and ``status`` (on an SQLite database
it migrates first) ``--runs`` times each and prints the median and the minimum of each. CPU
time is what a busy machine cannot take away from the command; wall time is what a person
waits. Targets: ``--help``/``--version`` under 0.5 s of CPU, ``regressions``/``status`` under 1.5 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def measure(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """CPU seconds (user + system of the child) and wall seconds of each of ``runs`` runs."""
    cpu, wall = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    abwatch = shutil.which("abwatch", path=os.path.dirname(sys.executable)) or "abwatch"
    work = tempfile.mkdtemp()
    url = args.db or f"sqlite:///{work}/startup.db"
    subprocess.run([abwatch, "db", "upgrade", "--db", url], check=True, stdout=subprocess.DEVNULL)
    print(f"{'command':<22} {'CPU median':>11} {'CPU min':>8} {'wall median':>12} {'wall min':>9}")
    for command in (["--version"], ["--help"], ["regressions", "--db", url], ["status", "--db", url]):
        cpu, wall = measure([abwatch, *command], args.runs)
        print(f"{command[0]:<22} {statistics.median(cpu):>10.2f}s {min(cpu):>7.2f}s "
              f"{statistics.median(wall):>11.2f}s {min(wall):>8.2f}s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
