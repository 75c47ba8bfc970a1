"""Samples a measured TVM process should take, from the variance components, per workload.

    python -m benchmarks.tvm_samples --cache .abwatch/cache [--workloads mlp,cnn,matmul]
        [--modes forked,fresh] [--pairs 20] [--busy 0]

One ``abwatch compare`` A/A of 0.27.0.post1 per workload and mode (the quickstart's three TVM
workloads, one thread a process), every process taking 200 samples and a fixed number of
pairs, into a SQLite database kept for the analysis; then, from the stored invocations and raw
samples, :func:`abwatch.service.stats.repetitions.choose_samples` over both sides' processes
(an A/A: one population): per candidate count the spread of processes' fastest of their first
``n`` samples, a process's cost (the median fixed part, the invocation's wall time less its
timing batch, plus ``n`` samples), and the time to a given interval width relative to the
default 100. Busy loops beside it with ``--busy``. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from sqlalchemy import select

from abwatch.service.compare import noise
from abwatch.service.stats.repetitions import choose_samples
from abwatch.service.store import db
from abwatch.service.store.models import Invocation, Sample
from benchmarks.load import busy_loops

VERSION = "0.27.0.post1"
TAKEN = 200  # samples every measured process takes: the candidates are its first n
MODELS = {
    "mlp": 'model = "builtin:mlp"\ninput_shape = [1, 256]\n',
    "cnn": 'model = "builtin:cnn"\ninput_shape = [1, 3, 32, 32]\n',
    "matmul": 'model = "te:matmul"\noptions = {m = 128, k = 128, n = 128}\n',
}
CONFIG = """cache_dir = {cache}
[build]
kind = "tvm-wheel"
[runner]
kind = "cpu"
threads = 1
processes = "{mode}"
[run]
repetitions = {pairs}
max_repetitions = {pairs}
max_seconds = 3600
compile_repetitions = 0
noise_aware = false
[[workloads]]
name = "w"
kind = "tvm"
samples = {taken}
{model}"""


def measured(database: Path) -> tuple[list[list[float]], float, float]:
    """The processes' samples in the order taken, the median fixed part of a process and the
    median seconds a sample (the product's :func:`noise.process_costs`), from one run's database."""
    engine = db.make_engine(f"sqlite:///{database}")
    with db.session_scope(engine) as session:
        run_id, workload_id = session.execute(select(Invocation.run_id, Invocation.workload_id).limit(1)).one()
        samples: dict[int, list[float]] = defaultdict(list)
        for invocation, ms in session.execute(select(Sample.invocation_id, Sample.runtime_ms)
                                              .where(Sample.warmup.is_(False)).order_by(Sample.order_index)):
            samples[invocation].append(ms)
        costs = noise.process_costs(session, run_id, workload_id, TAKEN)
    engine.dispose()
    assert costs is not None, f"{database}: no timed invocation"
    return [s for s in samples.values() if len(s) == TAKEN], *costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path(".abwatch/cache"))
    parser.add_argument("--workloads", default=",".join(MODELS))
    parser.add_argument("--modes", default="forked,fresh")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the runs")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, busy_loops(args.busy):
        work = Path(tmp)
        work.chmod(0o755)  # measured processes may run as the sandbox's user
        for workload in args.workloads.split(","):
            for mode in args.modes.split(","):
                config = work / f"{workload}-{mode}.toml"
                config.write_text(CONFIG.format(cache=json.dumps(str(args.cache.resolve())), mode=mode,
                                                pairs=args.pairs, taken=TAKEN, model=MODELS[workload]))
                database = work / f"{workload}-{mode}.db"
                proc = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config",
                                       str(config), "--control", VERSION, "--treatment", VERSION, "--json",
                                       "--db", f"sqlite:///{database}"], capture_output=True, text=True, check=False)
                if not proc.stdout.startswith("{"):
                    raise SystemExit(f"{workload} {mode}: compare failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
                processes, fixed, per_sample = measured(database)
                choice = choose_samples(processes, fixed_s=fixed, sample_s=per_sample, configured=100)
                print(json.dumps({"workload": workload, "mode": mode, "busy": args.busy, "fixed_s": fixed,
                                  "sample_s": per_sample, "processes": len(processes), "chosen": choice.samples,
                                  "options": [o.__dict__ for o in choice.options]}), file=sys.stderr, flush=True)
                rows.append((workload, mode, fixed, per_sample, choice))
    print(f"\nTVM {VERSION} A/A, {args.pairs} pairs, {TAKEN} samples a process, {args.busy} busy loops")
    print("| workload | mode | fixed ms | sample ms | " + " | ".join(f"n={n}: cv, rel. time" for n in (5, 10, 20, 50, 100, 200))
          + " | chosen |")
    print("|---|---|---:|---:|" + "---:|" * 6 + "---:|")
    for workload, mode, fixed, per_sample, choice in rows:
        by = {o.samples: o for o in choice.options}
        cells = [f"{by[n].process_cv:.2%}, {by[n].relative_time:.2f}" if n in by else "-" for n in (5, 10, 20, 50, 100, 200)]
        print(f"| {workload} | {mode} | {fixed * 1000:.0f} | {per_sample * 1000:.3f} | {' | '.join(cells)} | {choice.samples} |")


if __name__ == "__main__":
    main()
