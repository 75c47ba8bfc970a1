"""The GPU runner: TVM workloads compiled for one of TVM's device APIs and timed on this
machine's device: CUDA, ROCm, Vulkan, OpenCL or Metal (:mod:`.device_apis`).

``[runner] target`` picks the API (``{kind = "vulkan"}`` or a target string such as
``"opencl -device=mali"``; CUDA when absent). The runner refuses to start where the API's
driver lists no device, naming the API, what to install and what it looked for. Each build is
asked, before it is measured, whether its runtime has the backend (``tvm.runtime.enabled``;
``tvm.support.libinfo()`` only as a hint: recent TVM's is a Python fallback of defaults): a
build without it is refused by name rather than timed as a failure. In the worker, every
timed call is synchronised with the device (``time_evaluator`` and the per-operator hook
sync), Relax models get TVM's default GPU schedules through
``tvm.compile``'s pipeline, kernels without a schedule get dlight's, and the compiling
worker's output is checked against the same build's CPU output.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import TypeGuard

from abwatch.core.device_identity import DeviceInfo
from abwatch.builders.environment import ArtifactInfoError, build_environment, build_python
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import RunnerConfig
from abwatch.runners.fingerprint import host_fingerprint
from abwatch.runners.runner import Runner, RunnerUnavailable
from abwatch.runners.device_apis import DeviceApi, api_of
from abwatch.runners.sysinfo import hardware_config, software_config
from abwatch.runners.tvm_sessions import TvmSessions
from abwatch.runners.worker_process import WORKER_DIR

# The worker's device module (runners/worker/device.py): run by the build's Python, never
# imported by abwatch.
DEVICE_FILE = WORKER_DIR / "device.py"
# Run by a build's Python: what it says of one device API (device.backend) and why it cannot
# run there (device.refusal, None if it can), one JSON line; nothing is compiled. device.py is
# loaded by its path, as the worker loads it.
BACKEND = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("abwatch_worker_device", sys.argv[1])
device = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device)
import tvm
said = device.backend(tvm, sys.argv[2])
print(json.dumps({**said, "refusal": device.refusal(sys.argv[2], said)}))
"""


# what BACKEND answers, key by key: a build's answer of any other shape is refused
BACKEND_KEYS: dict[str, type | tuple[type, ...]] = {
    "tvm": str, "enabled": bool, "exist": bool, "library": (str, type(None)), "libinfo": str,
    "refusal": (str, type(None))}


def _well_formed(said: object) -> TypeGuard[dict]:
    """Whether a build's answer to BACKEND has the shape BACKEND gives."""
    return isinstance(said, dict) and all(isinstance(said.get(key), kind) for key, kind in BACKEND_KEYS.items())


def device_target(target: dict | str | None) -> dict | str:
    """The target the workloads compile for: a table gets ``from_device = 0`` unless it says
    otherwise, so TVM reads the device's own limits and capabilities (without it a Vulkan
    target assumes no 64-bit integers and a Relax model does not compile); a target string is
    the user's exact word."""
    if isinstance(target, str):
        return target
    return {"from_device": 0, **(target or {"kind": "cuda"})}


class GpuRunner(Runner):
    """Runs TVM workloads on this machine's first device of ``runner.target``'s API."""

    kind = "gpu"

    def __init__(self, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig(kind="gpu")
        try:
            self.api: DeviceApi = api_of(self.config.target)
        except ValueError as exc:
            raise RunnerUnavailable(f"gpu runner: {exc}") from None
        self.tvm = TvmSessions(self.config, device_target(self.config.target), self.api.name,
                               nodes=tuple(self.api.device_nodes()))
        self._checked: dict[Path, str | None] = {}

    def device_name(self) -> str:
        """``runner.device``, else ``<host>-<first device's name>`` (it refuses where there is none)."""
        return self.config.device or self._named(self._devices())

    @staticmethod
    def _named(devices: list[dict]) -> str:
        """``<host>-<model>``: the first device's model, without what a driver update changes
        (lavapipe says "llvmpipe (LLVM 15.0.6, 256 bits)"; a Mesa upgrade must not rename the
        device, which would start a new queue and a new series)."""
        name = re.sub(r"\s*\(.*?\)", "", devices[0]["name"]).strip() or "device"
        return f"{socket.gethostname()}-{''.join(c if c.isalnum() or c in '.-_' else '-' for c in name)}"

    def _devices(self) -> list[dict]:
        why = self.api.unavailable()
        if why is not None:
            raise RunnerUnavailable(f"gpu runner ({self.api.name}): {why}")
        devices = self.api.devices()
        if not devices:
            raise RunnerUnavailable(f"gpu runner: no {self.api.name} device on this machine (its driver lists "
                                    f"none); it needs {self.api.packages}")
        return devices

    def prepare(self) -> DeviceInfo:
        devices = self._devices()
        # the fingerprint: the host's, the API and every device its driver lists (name, driver, memory)
        hardware = {**hardware_config(), "device_api": self.api.name, "gpus": devices}
        software = software_config()
        return DeviceInfo(
            name=self.config.device or self._named(devices),  # the driver asked once
            kind=self.kind,
            hardware_config=hardware,
            software_config=software,
            runtime_config={"num_threads": self.config.measured_threads(None, host_cpu=False),
                            "target": self.config.target},
            fingerprint=host_fingerprint(hardware, software, self.tvm.target),  # what the workloads compile for
        )

    def check_build(self, artifact_dir: Path) -> None:
        """Refuse a build that lacks this API's backend or sees no device through it."""
        if artifact_dir not in self._checked:
            self._checked[artifact_dir] = self._refusal(artifact_dir)
        refusal = self._checked[artifact_dir]
        if refusal is not None:
            raise RunnerUnavailable(refusal)

    def _refusal(self, artifact_dir: Path) -> str | None:
        try:
            python = build_python(artifact_dir)
        except ArtifactInfoError as exc:
            return str(exc)
        if python is None:  # a command build: its workloads are not TVM's, nothing to ask
            return None
        argv = [str(python), "-c", BACKEND, str(DEVICE_FILE), self.api.name]
        env = child_env(build_environment(artifact_dir), {})
        proc = run_process(argv, cwd=artifact_dir, env=env, timeout_s=300, sandbox=Sandbox(devices=self.tvm.nodes))
        lines = proc.stdout.strip().splitlines()
        try:
            said = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
        except ValueError:
            said = None
        if not _well_formed(said):  # the build's own Python answered: anything may come back
            return (f"gpu runner: the build in {artifact_dir} could not say whether it has the {self.api.name} "
                    f"backend: {(proc.stderr or proc.stdout).strip()[-300:] or 'no output'}")
        why = said["refusal"]
        return None if why is None else (f"gpu runner: the build in {artifact_dir} (TVM {said['tvm']}) cannot run "
                                         f"on {self.api.name}: {why}")

    def teardown(self) -> None:
        """Remove the compiled libraries."""
        self.tvm.close()
