"""Which figure of a process's own CPU samples judges a contended TVM run best, replayed.

    python -m benchmarks.cpu_figures DB [DB ...]

Each ``DB`` is one comparison's SQLite database kept by ``python -m benchmarks.tvm_decisive
--keep DIR`` (a workload whose samples' own CPU times were stored, ``samples.cpu_ms``: a
timed call of 5 ms or more, or an LLM's generation). For each run, its stored timed processes
are judged again by :func:`abwatch.service.stats.compare` (paired by position, the fork server
as a level, abwatch's defaults), once per figure a process could be judged by: its batch's CPU time (what a process
whose samples are not marked is judged by), the mean, median, fastest and faster half
(:func:`abwatch.service.stats.cpu_figure`) of its samples' CPU times, and its fastest wall-time
sample. Printed per figure: the median interval width over the runs, in how many runs it was
narrower than the batch's, and the median estimate. The same processes and the same rule for
every figure, so only the figure differs; the runs stopped when the figure they were judged by
said so, which favours that one. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import select

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.service import stats
from abwatch.service.store import db
from abwatch.service.store.models import Invocation, InvocationStatus, Sample

FIGURES: dict[str, Callable[[Sequence[float], Sequence[float], float], float]] = {
    # (a process's samples' CPU times in ms, its wall-time samples in ms, its batch's CPU seconds)
    "batch CPU time": lambda cpu, wall, batch: batch,
    "mean of the CPU samples": lambda cpu, wall, batch: statistics.fmean(cpu),
    "median": lambda cpu, wall, batch: statistics.median(cpu),
    "fastest": lambda cpu, wall, batch: min(cpu),
    "faster half (stats.cpu_figure)": lambda cpu, wall, batch: stats.cpu_figure(cpu),
    "fastest wall-time sample": lambda cpu, wall, batch: min(wall),
}


def processes(path: Path) -> list[tuple[str, int, int | None, list[float], list[float], float]]:
    """The timed processes of the comparison stored in ``path`` whose samples were all marked:
    (side, position, fork server, CPU samples, wall-time samples, batch CPU seconds)."""
    samples: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    with db.session_scope(db.make_engine(f"sqlite:///{path}")) as session:
        invocations = session.scalars(select(Invocation).where(Invocation.warmup.is_(False),
                                                               Invocation.status == InvocationStatus.OK)).all()
        for row in session.execute(select(Sample.invocation_id, Sample.runtime_ms, Sample.cpu_ms)
                                   .where(Sample.warmup.is_(False)).order_by(Sample.order_index)):
            samples[row.invocation_id].append((row.runtime_ms, row.cpu_ms))
        found = []
        for inv in invocations:
            taken = samples.get(inv.id)
            if not taken or inv.cpu_s is None or any(cpu is None for _, cpu in taken):
                continue
            found.append((inv.side.value, inv.position, inv.server, [cpu for _, cpu in taken],
                          [wall for wall, _ in taken], inv.cpu_s))
    return found


def replay(found: list[tuple[str, int, int | None, list[float], list[float], float]],
           figure: Callable[[Sequence[float], Sequence[float], float], float]) -> stats.Verdict:
    """The run's processes judged by ``figure``, one value a process, paired by position."""
    sides = {side: sorted((p for p in found if p[0] == side), key=lambda p: p[1]) for side in (CONTROL, TREATMENT)}
    values = {side: [figure(p[3], p[4], p[5]) for p in sides[side]] for side in sides}
    groups = {side: [p[1] for p in sides[side]] for side in sides}
    servers = {side: [p[2] for p in sides[side]] for side in sides}
    forked = any(s is not None for side in sides for s in servers[side])
    return stats.compare(values[CONTROL], values[TREATMENT], control_groups=groups[CONTROL],
                         treatment_groups=groups[TREATMENT], paired=True,
                         **({"control_servers": servers[CONTROL], "treatment_servers": servers[TREATMENT]}
                            if forked else {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("databases", nargs="+", type=Path)
    args = parser.parse_args()
    widths: dict[str, list[float | None]] = defaultdict(list)
    estimates: dict[str, list[float]] = defaultdict(list)
    runs = 0
    for path in args.databases:
        found = processes(path)
        if not found:
            print(f"{path}: no process with every sample's CPU time marked: skipped")
            continue
        runs += 1
        for name, figure in FIGURES.items():
            verdict = replay(found, figure)
            low, high = verdict.ci_pct or (None, None)
            widths[name].append(high - low if low is not None else None)
            if verdict.change_pct is not None:
                estimates[name].append(verdict.change_pct)
    print(f"{runs} runs replayed")
    print("| a process judged by | median width (points) | narrower than the batch's | "
          "width / the batch's (median) | median estimate |")
    print("|---|---:|---:|---:|---:|")
    base = widths["batch CPU time"]
    for name in FIGURES:
        both = [(w, b) for w, b in zip(widths[name], base, strict=True) if w is not None and b]
        known = [w for w in widths[name] if w is not None]
        print(f"| {name} | {statistics.median(known) if known else float('nan'):.2f} | "
              f"{sum(w < b for w, b in both)} of {len(both)} | "
              f"{statistics.median(w / b for w, b in both) if both else float('nan'):.2f} | "
              f"{statistics.median(estimates[name]) if estimates[name] else float('nan'):+.2f} % |")


if __name__ == "__main__":
    main()
