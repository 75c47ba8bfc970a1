"""Where a timed TVM worker's time goes, on this machine: one fresh process per invocation.

    python -m benchmarks.tvm_worker_phases [--processes 8] [--model builtin:mlp]

The workload's library is compiled and exported once (as a build's first worker does); then
``--processes`` fresh processes of the build's Python each load it as a timed worker does
(``runners/worker/tvm_worker.py``'s ``Workload`` with ``load``), and say when each phase ended:

* **start**: from the parent's ``Popen`` to the child's first line of Python;
* **numpy**, **tvm** (``import tvm``), **relax** (``from tvm import relax``);
* **model**: the workload's module, parameters and inputs made again (a builtin model is
  exported from its ``nn.Module`` to learn its parameters' shapes, even when the library is
  loaded);
* **load**: ``tvm.runtime.load_module`` of the exported library;
* **setup**: the rest of ``Workload``: tensors on the device, the VM, the time evaluator;
* **warm-up**: the first call (lazy set-up, not timed by the evaluator either);
* **samples**: the timing batch (``repeat`` samples of ``number`` calls);
* **ops**: the per-operator times of one instrumented call (each invocation reports them).

Then the same number of real invocations through the runner (``TvmSessions.run``: the sandbox,
the protocol, the exit) with ``processes = "fresh"`` and ``"forked"``, for their wall time each,
on TVM's runtime library alone with the inputs the compiling worker saved (abwatch's way) and,
as before it, with the compiler loaded (``TvmSessions.runtime_refused``), the four in turn.
Medians over the processes, milliseconds. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from abwatch.builders import TvmWheelBuilder
from abwatch.builders.environment import build_environment, build_python
from abwatch.builders.procs import child_env
from abwatch.builders.spec import RunnerConfig
from abwatch.runners import CpuRunner
from abwatch.runners.worker_process import WORKER
from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig

# Run in the build's Python: each phase's end, as time.time(), in one JSON line.
CHILD = r"""
import json, sys, time
T = {"spawned": float(sys.argv[1]), "python": time.time()}
import numpy
T["numpy"] = time.time()
import tvm
T["tvm"] = time.time()
from tvm import relax
T["relax"] = time.time()
import importlib.util
spec_ = importlib.util.spec_from_file_location("worker", sys.argv[2])
W = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(W)
spent = {"model": 0.0, "load": 0.0}
def timed(name, f):
    def g(*a, **k):
        t = time.time(); r = f(*a, **k); spent[name] += time.time() - t; return r
    return g
for source in W._sibling("sources").SOURCES.values():  # each source's build (runners/worker/sources.py)
    source.build = timed("model", source.build)
tvm.runtime.load_module = timed("load", tvm.runtime.load_module)
t = time.time()
w = W.Workload(json.loads(sys.argv[3]))
T["workload"] = time.time()
w.call(*w.args); w.dev.sync()
T["warm-up"] = time.time()
w.timer(*w.args)
T["samples"] = time.time()
w._ops({})
T["ops"] = time.time()
print(json.dumps({"T": T, "spent": spent, "worker_start": t}))
"""

PHASES = ("start", "numpy", "tvm", "relax", "model", "load", "setup", "warm-up", "samples", "ops")


def phases(python: Path, env: dict[str, str], spec: dict) -> dict[str, float]:
    """One fresh process's phases (ms)."""
    spawned = time.time()
    out = subprocess.run([str(python), "-c", CHILD, repr(spawned), str(WORKER), json.dumps(spec)],
                         env=env, capture_output=True, text=True, check=True).stdout
    reply = json.loads(out.strip().splitlines()[-1])
    T, spent = reply["T"], reply["spent"]
    ms = {"start": T["python"] - spawned, "numpy": T["numpy"] - T["python"], "tvm": T["tvm"] - T["numpy"],
          "relax": T["relax"] - T["tvm"], "model": spent["model"], "load": spent["load"],
          "setup": T["workload"] - reply["worker_start"] - spent["model"] - spent["load"],
          "warm-up": T["warm-up"] - T["workload"], "samples": T["samples"] - T["warm-up"],
          "ops": T["ops"] - T["samples"]}
    return {k: v * 1000 for k, v in ms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--model", default="builtin:mlp")
    parser.add_argument("--version", default="0.27.0.post1")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/abwatch-bench-cache"))
    args = parser.parse_args()
    workload = TvmWorkloadConfig(name="w", model=args.model)
    config = Config(build=TvmWheelBuildConfig(), cache_dir=args.cache, workloads=[workload])
    artifact = TvmWheelBuilder(config).build(args.version).path
    python = build_python(artifact)
    assert python is not None
    env = child_env(build_environment(artifact), {"TVM_NUM_THREADS": "1"})
    fresh = CpuRunner(RunnerConfig(threads=1, processes="fresh"))
    runners = {f"{processes}, {libraries}": CpuRunner(RunnerConfig(threads=1, processes=processes))
               for processes in ("fresh", "forked") for libraries in ("runtime alone", "compiler too")}
    try:
        first = fresh.run(artifact, workload, 600)  # compiles and exports the library once
        assert first.status == "ok", first.message
        lib = fresh.tvm._lib(artifact, workload, "control")
        spec = dict(fresh.tvm.spec(workload, {}), load=str(lib))
        rows = [phases(python, env, spec) for _ in range(args.processes)]
        times: dict[str, list[float]] = {name: [] for name in runners}
        for name, runner in runners.items():
            runner.run(artifact, workload, 600)  # its first: compiles and saves the inputs
            if name.endswith("compiler too"):
                runner.tvm.runtime_refused[workload.name] = "measured with the compiler loaded"
        for _ in range(args.processes):
            for name, runner in runners.items():  # in turn: each sees the same load
                result = runner.run(artifact, workload, 600)
                assert result.status == "ok", result.message
                times[name].append(result.wall_s * 1000)
        walls = {name: statistics.median(t) for name, t in times.items()}
    finally:
        fresh.teardown()
        for runner in runners.values():
            runner.teardown()
    print(f"{args.model}, TVM {args.version}, {args.processes} processes, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs; medians, ms")
    total = 0.0
    for phase in PHASES:
        median = statistics.median(r[phase] for r in rows)
        total += median
        print(f"  {phase:<8} {median:9.1f}")
    print(f"  {'sum':<8} {total:9.1f}")
    for name, wall in walls.items():
        print(f"  invocation through the runner, {name}: {wall:9.1f}")


if __name__ == "__main__":
    main()
