"""Pairs a minute of a TVM workload with fresh and with forked timed workers, side by side.

    python -m benchmarks.tvm_forked_pairs [--pairs 30] [--rounds 2] [--model builtin:mlp]

Each round runs one comparison per mode (``[runner] processes = "fresh"``, then ``"forked"``,
the order swapped every other round) through ``abwatch compare``: an A/A of one TVM release
against itself, ``--pairs`` measured pairs in one look (``repetitions = max_repetitions``),
one thread a process, a SQLite database of its own. For each it prints the verdict and its
interval, the pairs a minute over the workload's whole measuring (``elapsed_s``, the compiling
warm-up included) and over the measured invocations alone (their summed ``wall_s``), and the
spread: the coefficient of variation of the processes' fastest samples, the s.d. of the pairs'
log ratios, and for forked workers the share of that variance between blocks of pairs served by
one pair of servers (one-way analysis of variance: the layout a server's children share, which
pairs taken as independent would leave out). Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from sqlalchemy import select

from abwatch.service.cli.main import main as abwatch
from abwatch.service.store import db
from abwatch.service.store.models import Invocation, Sample

CONFIG = """
cache_dir = {cache}
[build]
kind = "tvm-wheel"
[runner]
kind = "cpu"
threads = 1
processes = "{mode}"
children_per_server = {children}
[run]
repetitions = {pairs}
max_repetitions = {pairs}
max_seconds = 3600
compile_repetitions = 0
noise_aware = false
[[workloads]]
name = "w"
kind = "tvm"
model = "{model}"
"""


def between_servers(by_block: dict) -> float | None:
    """The share of the pairs' log ratios' variance that lies between blocks of one control
    server and one treatment server (one-way ANOVA's intraclass correlation, 0 where the blocks'
    means differ no more than chance says): what the statistics, which take pairs as
    independent, would have to allow for."""
    groups = [g for g in by_block.values() if len(g) >= 2]
    if len(groups) < 2:
        return None
    n = statistics.mean(len(g) for g in groups)
    grand = statistics.mean(x for g in groups for x in g)
    between = sum(len(g) * (statistics.mean(g) - grand) ** 2 for g in groups) / (len(groups) - 1)
    within = sum((x - statistics.mean(g)) ** 2 for g in groups for x in g) / (sum(map(len, groups)) - len(groups))
    component = max(0.0, (between - within) / n)
    return component / (component + within) if component + within else 0.0


def one(mode: str, args, work: Path) -> dict:
    """One comparison in ``mode``, and its figures."""
    config = work / f"{mode}.toml"
    config.write_text(CONFIG.format(cache=json.dumps(str(args.cache)), mode=mode, children=args.children,
                                    pairs=args.pairs, model=args.model))
    url = f"sqlite:///{work / (mode + '.db')}"
    load = os.getloadavg()[0]
    started = time.monotonic()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = abwatch(["compare", "--config", str(config), "--control", args.version, "--treatment", args.version,
                        "--json", "--db", url])
    wall = time.monotonic() - started
    assert code in (0, 1), code
    (result,) = json.loads(printed.getvalue())["results"]
    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        rows = session.scalars(select(Invocation).where(Invocation.warmup.is_(False))
                               .order_by(Invocation.position)).all()
        fastest: dict[str, list[tuple[float, int | None]]] = {"control": [], "treatment": []}
        for row in rows:  # each process judged by its fastest sample, as the statistics judge it
            samples = session.scalars(select(Sample.runtime_ms).where(Sample.invocation_id == row.id)).all()
            fastest[row.side.value].append((min(samples), row.server))
        measured_s = sum(r.wall_s for r in rows)
    engine.dispose()
    cv = statistics.mean(statistics.stdev(m for m, _ in fastest[side]) / statistics.mean(m for m, _ in fastest[side])
                         * 100 for side in fastest)
    # the i-th control process against the i-th treatment process: the statistics' pairs
    ratios = [(math.log(t / c), (cs, ts))
              for (c, cs), (t, ts) in zip(fastest["control"], fastest["treatment"], strict=True)]
    blocks: dict = defaultdict(list)
    for ratio, servers in ratios:
        if None not in servers:
            blocks[servers].append(ratio)
    icc = between_servers(blocks)
    return {"mode": mode, "verdict": result["verdict"], "ci_pct": result["ci_pct"],
            "pairs": args.pairs, "elapsed_s": round(result["elapsed_s"], 1), "command_s": round(wall, 1),
            "pairs_per_min": round(args.pairs / result["elapsed_s"] * 60, 1),
            "measured_pairs_per_min": round(args.pairs / measured_s * 60, 1),
            "process_cv_pct": round(cv, 2), "pair_sd_pct": round(statistics.stdev(r for r, _ in ratios) * 100, 2),
            "between_servers": None if icc is None else round(icc, 2),
            "server_pairs": len(blocks), "load": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--children", type=int, default=8, help="children_per_server")
    parser.add_argument("--model", default="builtin:mlp")
    parser.add_argument("--version", default="0.27.0.post1")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/abwatch-bench-cache"))
    parser.add_argument("--modes", default="fresh,forked", help="the modes, comma-separated")
    parser.add_argument("--out", type=Path, help="JSON lines, one a comparison")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="abwatch-forked-pairs-") as tmp:
        os.chmod(tmp, 0o755)  # the sandbox hides the config file in it, and must reach the directory to
        for n in range(args.rounds):
            modes = args.modes.split(",")
            for mode in modes if n % 2 == 0 else modes[::-1]:
                work = Path(tmp) / str(n)
                work.mkdir(exist_ok=True)
                row = one(mode, args, work)
                print(json.dumps(row), flush=True)
                rows.append(row)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
    print(f"\n{args.model}, A/A {args.version}, {args.pairs} pairs, one thread a process, "
          f"{os.cpu_count()} CPUs; medians over {args.rounds} rounds")
    print(f"{'mode':<7} {'pairs/min':>9} {'measured':>9} {'process CV %':>12} {'pair s.d. %':>11} "
          f"{'between servers':>15}  verdicts")
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode]
        icc = [r["between_servers"] for r in mine if r["between_servers"] is not None]
        print(f"{mode:<7} {statistics.median(r['pairs_per_min'] for r in mine):9.1f} "
              f"{statistics.median(r['measured_pairs_per_min'] for r in mine):9.1f} "
              f"{statistics.median(r['process_cv_pct'] for r in mine):12.2f} "
              f"{statistics.median(r['pair_sd_pct'] for r in mine):11.2f} "
              f"{(f'{statistics.median(icc):.2f}' if icc else '-'):>15}  "
              f"{', '.join(r['verdict'] for r in mine)}")


if __name__ == "__main__":
    main()
