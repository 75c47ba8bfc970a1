"""The local CPU runner: each invocation is a separate process on this machine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from runners.base import InvocationResult, Runner
from runners.harness import OutputError, parse_output
from runners.sysinfo import hardware_config, software_config
from runners.tvm_sessions import TvmSessions
from service.config import CommandWorkloadConfig, RunnerConfig, TvmWorkloadConfig

STDERR_TAIL = 4000  # characters of a failed invocation's stderr kept as its message


class CpuRunner(Runner):
    """Runs workload commands as local processes, each in its own process group."""

    kind = "cpu"

    def __init__(self, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig()
        self.device = self.config.device or socket.gethostname()
        target = self.config.target or {"kind": "llvm", "mcpu": "native"}
        self.tvm = TvmSessions(self.config, target, "cpu")

    def prepare(self) -> dict:
        return {
            "name": self.device,
            "kind": self.kind,
            "hardware_config": hardware_config(),
            "software_config": software_config(),
            "runtime_config": {"num_threads": self.config.threads or os.cpu_count()},
        }

    def run(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
            timeout_s: float, side: str = "control") -> InvocationResult:
        if workload.kind == "tvm":
            options = workload.treatment_options if side == "treatment" else {}
            return self.tvm.run(artifact_dir, workload, timeout_s, side, options)
        env = dict(os.environ, **workload.env)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                workload.command,
                cwd=artifact_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                # Own process group, so a timeout kills the workload's children too.
                start_new_session=True,
            )
        except OSError as exc:
            return InvocationResult("error", (), 0.0, f"cannot start {workload.command[0]!r}: {exc.strerror}")
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return InvocationResult(
                "timeout", (), time.monotonic() - start, f"killed after {timeout_s:g}s timeout"
            )
        wall = time.monotonic() - start
        if proc.returncode != 0:
            tail = stderr[-STDERR_TAIL:].strip()
            return InvocationResult("error", (), wall, f"exited with status {proc.returncode}: {tail}")
        try:
            samples, records = parse_output(stdout)
        except OutputError as exc:
            return InvocationResult("error", (), wall, str(exc))
        return InvocationResult("ok", samples, wall, "", records)

    def teardown(self) -> None:
        """Stop the TVM workers; command invocations have ended already."""
        self.tvm.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
