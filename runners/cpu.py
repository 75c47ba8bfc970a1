"""The local CPU runner: each invocation is a separate process on this machine."""

from __future__ import annotations

import os
from pathlib import Path

from abwatch.builders.environment import ArtifactInfoError, build_environment
from abwatch.builders.procs import child_env, passed, run_process
from abwatch.builders.spec import CommandWorkloadConfig, RunnerConfig, TvmWorkloadConfig
from abwatch.runners.base import DeviceInfo, InvocationResult, Runner
from abwatch.runners.harness import OutputError, parse_output
from abwatch.runners.sysinfo import hardware_config, software_config
from abwatch.runners.tvm_sessions import TvmSessions

STDERR_TAIL = 4000  # characters of a failed invocation's stderr kept as its message


class CpuRunner(Runner):
    """Runs workload commands as local processes, each in its own process group."""

    kind = "cpu"

    def __init__(self, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig()
        target = self.config.target or {"kind": "llvm", "mcpu": "native"}
        self.tvm = TvmSessions(self.config, target, "cpu")

    def prepare(self) -> DeviceInfo:
        return DeviceInfo(
            name=self.device_name(),
            kind=self.kind,
            hardware_config=hardware_config(),
            software_config=software_config(),
            runtime_config={"num_threads": self.config.threads or os.cpu_count()},
        )

    def run(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
            timeout_s: float, side: str = "control") -> InvocationResult:
        if workload.kind == "tvm":
            options = workload.overrides(side)
            return self.tvm.run(artifact_dir, workload, timeout_s, side, options)
        try:
            # a TVM build's Python first on PATH, with its variables: `python bench.py` uses this build
            env = child_env(build_environment(artifact_dir), passed(workload.pass_env), workload.env)
        except ArtifactInfoError as exc:
            return InvocationResult("error", (), 0.0, str(exc))
        try:
            proc = run_process(workload.command, cwd=workload.cwd or artifact_dir, env=env,
                               timeout_s=timeout_s, max_output=workload.output_limit)
        except OSError as exc:
            return InvocationResult("error", (), 0.0, f"cannot start {workload.command[0]!r}: {exc.strerror}")
        if proc.overflowed:
            return InvocationResult("error", (), proc.wall_s,
                                    f"printed more than {workload.output_limit} bytes; killed, nothing of it kept "
                                    f"(raise workloads.{workload.name}.max_output_mb if that much is expected)")
        if proc.timed_out:
            return InvocationResult("timeout", (), proc.wall_s, f"killed after {timeout_s:g}s timeout")
        if proc.returncode != 0:
            tail = proc.stderr[-STDERR_TAIL:].strip()
            return InvocationResult("error", (), proc.wall_s, f"exited with status {proc.returncode}: {tail}")
        try:
            samples, records = parse_output(proc.stdout, max_samples=workload.samples_limit)
        except OutputError as exc:
            return InvocationResult("error", (), proc.wall_s, str(exc))
        return InvocationResult("ok", samples, proc.wall_s, "", records)

    def teardown(self) -> None:
        """Stop the TVM workers; command invocations have ended already."""
        self.tvm.close()

