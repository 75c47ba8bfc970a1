"""The local CPU runner: each invocation is a separate process on this machine."""

from __future__ import annotations

from abwatch.core.device_identity import DeviceInfo
from abwatch.builders.spec import RunnerConfig
from abwatch.runners.fingerprint import host_fingerprint
from abwatch.runners.runner import Runner
from abwatch.runners.sysinfo import hardware_config, software_config
from abwatch.runners.tvm_sessions import TvmSessions

class CpuRunner(Runner):
    """Runs workload commands as local processes, each in its own process group."""

    kind = "cpu"

    def __init__(self, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig()
        self.target = self.config.target or {"kind": "llvm", "mcpu": "native"}
        self.tvm = TvmSessions(self.config, self.target, "cpu")

    def prepare(self) -> DeviceInfo:
        hardware, software = hardware_config(), software_config()
        return DeviceInfo(
            name=self.device_name(),
            kind=self.kind,
            hardware_config=hardware,
            software_config=software,
            runtime_config={"num_threads": self.config.measured_threads(None, host_cpu=True)},  # a workload's may differ
            fingerprint=host_fingerprint(hardware, software, self.target),
        )

    def teardown(self) -> None:
        """Stop the TVM workers; command invocations have ended already."""
        self.tvm.close()

