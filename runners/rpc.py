"""The RPC runner: TVM workloads on a board reached through a TVM RPC tracker.

Each build compiles on this host with its own TVM, exports the library, asks the tracker
for a session with the device ``key``, uploads the library and times it on the board
(``time_evaluator`` runs on the board; only the results come back). What an A/B on a board
measures: both builds' code-generation and the kernels they produce. The board's RPC
runtime (the server process) is one and the same for both sides, so a change in TVM's
runtime itself — the VM, memory allocator, threading pool — is measured only as far as
it reaches the uploaded library; rebuild the board's runtime to A/B that. A Relax model's
per-operator times are measured on the board too: each kernel by its own time evaluator
there, on arguments of the shapes a dry run of the VM on this host found
(``runners/worker/ops.py``: why not the VM's instrument hook, which cannot reach the board).
"""

from __future__ import annotations

import socket

from abwatch.core.device_identity import DeviceInfo
from abwatch.builders.spec import RunnerConfig
from abwatch.runners.runner import Runner, RunnerUnavailable
from abwatch.runners.fingerprint import board_fingerprint
from abwatch.runners.sysinfo import software_config
from abwatch.runners.tvm_sessions import TvmSessions


class RpcRunner(Runner):
    """Runs TVM workloads on ``runner.key`` through the tracker at ``runner.tracker``."""

    kind = "rpc"

    def __init__(self, config: RunnerConfig) -> None:
        if not config.tracker or not config.key:  # the config's validation says so already
            raise RunnerUnavailable("an rpc runner needs tracker and key")
        self.config, self.tracker, self.key = config, config.tracker, config.key
        rpc = {"tracker": config.tracker, "key": config.key}
        self.tvm = TvmSessions(config, config.target or {"kind": "llvm"}, "cpu", rpc=rpc)

    def device_name(self) -> str:
        """``runner.device``, else the board's tracker key."""
        return self.config.device or self.key

    def prepare(self) -> DeviceInfo:
        host, port = self.tracker.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as exc:
            raise RunnerUnavailable(f"rpc runner: tracker {self.tracker} is not reachable: {exc}") from None
        return DeviceInfo(
            name=self.device_name(),
            kind=self.kind,
            hardware_config={"rpc_key": self.key, "tracker": self.tracker},
            software_config={"host": software_config()},
            runtime_config={"num_threads": self.config.threads if self.config.threads != "all" else None},
            fingerprint=board_fingerprint(self.key, self.config.target or {"kind": "llvm"}),
        )

    def teardown(self) -> None:
        """Remove the compiled libraries (the board's sessions end with each worker)."""
        self.tvm.close()
