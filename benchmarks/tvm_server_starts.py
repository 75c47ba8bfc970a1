"""What a timed fork server's start and its children cost, on TVM's runtime library alone
against with its compiler, side by side.

    python -m benchmarks.tvm_server_starts [--servers 12] [--models builtin:mlp,builtin:cnn,te:matmul]

For each model, two forked runners (``[runner] processes = "forked"``, two children a server,
no successor started ahead, so each server's start is its first child's wait): one whose
servers import TVM's runtime library alone and whose children load the inputs the compiling
worker saved (abwatch's way where it can), one told to serve the workload with the compiler
loaded (``TvmSessions.runtime_refused``, as after a failure on the runtime library). Their
servers alternate, ``--servers`` of each. Prints, per model and kind, the median server start
(``server_start_s``: an interpreter and ``import tvm``) and the median wall time of a child
that found its server running (fork, load, one timing batch, exit), in milliseconds, and the
server's CPU time a child at the learnt two to three children a server. Nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from abwatch.builders import TvmWheelBuilder
from abwatch.builders.spec import RunnerConfig
from abwatch.runners import CpuRunner
from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig

KINDS = ("runtime", "compiler")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=12)
    parser.add_argument("--models", default="builtin:mlp,builtin:cnn,te:matmul")
    parser.add_argument("--version", default="0.27.0.post1")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/abwatch-bench-cache"))
    args = parser.parse_args()
    print(f"TVM {args.version}, {args.servers} servers of each kind, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs; medians, ms")
    print("| model | servers | server start | child | start a child at 2 / 3 children |")
    print("|---|---|---:|---:|---:|")
    for model in args.models.split(","):
        workload = TvmWorkloadConfig(name="w", model=model, samples=5)
        config = Config(build=TvmWheelBuildConfig(), cache_dir=args.cache, workloads=[workload])
        artifact = TvmWheelBuilder(config).build(args.version).path
        runners = {kind: CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=2,
                                                servers_ahead=False)) for kind in KINDS}
        starts: dict[str, list[float]] = {kind: [] for kind in KINDS}
        children: dict[str, list[float]] = {kind: [] for kind in KINDS}
        loaded: dict[str, set[str]] = {kind: set() for kind in KINDS}  # the TVM libraries its servers mapped
        try:
            for kind, runner in runners.items():
                first = runner.run(artifact, workload, 600)  # compiles, exports, saves the inputs
                assert first.status == "ok", first.message
                if kind == "compiler":
                    runner.tvm.runtime_refused[(artifact, workload.name)] = "measured with the compiler"
            for _ in range(args.servers):
                for kind, runner in runners.items():
                    for _child in range(2):
                        result = runner.run(artifact, workload, 600)
                        assert result.status == "ok", result.message
                        if result.server_start_s is not None:
                            starts[kind].append(result.server_start_s * 1000)
                            loaded[kind] = {n for s in runner.tvm.timed.live.values() for n in s.libraries}
                        else:
                            children[kind].append(result.wall_s * 1000)
            for kind in KINDS:
                start, child = statistics.median(starts[kind]), statistics.median(children[kind])
                libraries = ", ".join(sorted(loaded[kind]))
                print(f"| {model} | {kind} ({libraries}) | {start:.0f} | {child:.0f} | {start / 2:.0f} / {start / 3:.0f} |")
        finally:
            for runner in runners.values():
                runner.teardown()


if __name__ == "__main__":
    main()
