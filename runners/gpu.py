"""The GPU runner: TVM workloads compiled for CUDA and timed on the local GPU.

It refuses to start where no CUDA device is present (no driver device node and no
``nvidia-smi`` that lists a GPU), with an error that says so, rather than timing nothing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from abwatch.builders.spec import RunnerConfig
from abwatch.runners.base import Runner, RunnerUnavailable
from abwatch.runners.results import DeviceInfo
from abwatch.runners.sysinfo import hardware_config, software_config
from abwatch.runners.tvm_sessions import TvmSessions


def cuda_devices() -> list[str]:
    """Names of the CUDA GPUs ``nvidia-smi -L`` lists (empty where there are none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not any(Path("/dev").glob("nvidia[0-9]*")):
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(":", 1)[1].split("(")[0].strip() for line in out.splitlines() if line.startswith("GPU ")]


class GpuRunner(Runner):
    """Runs TVM workloads with target ``cuda`` on this machine's first GPU."""

    kind = "gpu"

    def __init__(self, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig(kind="gpu")
        self.tvm = TvmSessions(self.config, self.config.target or {"kind": "cuda"}, "cuda")

    def device_name(self) -> str:
        """``runner.device``, else ``<host>-<first GPU's name>`` (it refuses where there is no GPU)."""
        return self.config.device or f"{socket.gethostname()}-{self._gpus()[0].replace(' ', '-')}"

    def _gpus(self) -> list[str]:
        gpus = cuda_devices()
        if not gpus:
            raise RunnerUnavailable("gpu runner: no CUDA device is present on this machine "
                                    "(no /dev/nvidia* device or nvidia-smi lists no GPU)")
        return gpus

    def prepare(self) -> DeviceInfo:
        gpus = self._gpus()
        return DeviceInfo(
            name=self.device_name(),
            kind=self.kind,
            hardware_config={**hardware_config(), "gpus": gpus},
            software_config=software_config(),
            runtime_config={"num_threads": self.config.threads or os.cpu_count()},
        )

    def teardown(self) -> None:
        """Remove the compiled libraries."""
        self.tvm.close()
