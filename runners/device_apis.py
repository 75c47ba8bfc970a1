"""TVM's device APIs as the ``gpu`` runner sees them: one small class per API, registered in
:data:`DEVICE_APIS`.

Each knows the device nodes a sandboxed worker must be given, and how the
operating system's own tool lists the devices and their drivers (``nvidia-smi``,
``vulkaninfo``, ``clinfo``, ``rocminfo``, ``system_profiler``): that listing, taken before any
build exists, is the device's fingerprint in the records and the refusal when it is empty.
Whether a build can drive the device is asked of the build itself (``runners/worker/device.py``:
its runtime decides). The APIs' names, and the CMake flag that builds each in, are core's
:data:`~abwatch.core.device_backends.DEVICE_BACKENDS`: a new API is a line there and its class here.
"""

from __future__ import annotations

import abc
import glob
import json
import platform
import re
import shutil
import subprocess
from typing import ClassVar

from abwatch.core.device_backends import DEVICE_BACKENDS
from abwatch.core.plugins import Registry


def _output(argv: list[str], timeout_s: float = 30.0) -> str | None:
    """What ``argv`` prints, or None where the tool is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


class DeviceApi(abc.ABC):
    """One of TVM's device APIs (``tvm.device(name)``)."""

    name: ClassVar[str]  # tvm.device()'s name and the target kind that compiles for it
    packages: ClassVar[str]  # what a machine needs installed, for the refusal's hint
    nodes: ClassVar[tuple[str, ...]] = ()  # device node globs a sandboxed worker is given

    @abc.abstractmethod
    def devices(self) -> list[dict]:
        """The devices this machine's driver lists: each ``{"name", "driver", "memory_bytes", ...}``
        (empty where there is none, or no driver)."""

    def unavailable(self) -> str | None:
        """Why no device of this API can be used here at all (None: look at :meth:`devices`)."""
        return None

    def device_nodes(self) -> list[str]:
        """The device nodes present on this machine that a worker for this API needs."""
        return [node for pattern in self.nodes for node in sorted(glob.glob(pattern))]


class Cuda(DeviceApi):
    """NVIDIA GPUs through the CUDA driver."""

    name = "cuda"
    packages = "the NVIDIA driver (nvidia-smi) and a TVM built with USE_CUDA (the apache-tvm wheel is)"
    nodes = ("/dev/nvidia*",)

    def devices(self) -> list[dict]:
        if not any(glob.glob("/dev/nvidia[0-9]*")):
            return []
        out = _output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"])
        found = []
        for line in (out or "").splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and parts[0]:
                memory = int(parts[2]) * 2**20 if parts[2].isdigit() else None  # nvidia-smi says MiB
                found.append({"name": parts[0], "driver": f"NVIDIA {parts[1]}", "memory_bytes": memory})
        return found


class Rocm(DeviceApi):
    """AMD GPUs through ROCm (HIP)."""

    name = "rocm"
    packages = "ROCm (rocminfo, /dev/kfd) and a TVM built with USE_ROCM"
    nodes = ("/dev/kfd", "/dev/dri/*")

    def devices(self) -> list[dict]:
        if not glob.glob("/dev/kfd"):
            return []
        out = _output(["rocminfo"]) or ""
        # rocminfo lists CPU agents too; a GPU agent is one whose name is gfx<arch>
        agents = re.findall(r"^\s*Name:\s*(gfx\w+)\s*$.*?^\s*Marketing Name:\s*(.+?)\s*$", out, re.M | re.S)
        driver = re.search(r"Runtime Version:\s*(\S+)", out)
        return [{"name": marketing, "arch": arch, "driver": f"ROCm {driver.group(1) if driver else '?'}",
                 "memory_bytes": None} for arch, marketing in agents]


class Vulkan(DeviceApi):
    """Any Vulkan driver: discrete and integrated GPUs, and Mesa's lavapipe on the CPU."""

    name = "vulkan"
    packages = ("a Vulkan driver (e.g. Debian mesa-vulkan-drivers), vulkan-tools for its listing, and a TVM "
                "built with USE_VULKAN (libvulkan-dev, spirv-tools, spirv-headers)")
    nodes = ("/dev/dri/*", "/dev/nvidia*")

    def unavailable(self) -> str | None:
        if shutil.which("vulkaninfo") is None:
            return ("vulkaninfo is not installed: it lists the devices a run records (Debian: vulkan-tools); "
                    f"the runner needs {self.packages}")
        return None

    def devices(self) -> list[dict]:
        out = _output(["vulkaninfo"], timeout_s=60)
        if out is None:  # no listing, no fingerprint: refused (unavailable() names vulkan-tools)
            return []
        found = []
        # vulkaninfo prints one "VkPhysicalDeviceProperties" block per device, its driver's
        # properties and memory heaps after it
        for block in re.split(r"^GPU\d+:\s*$", out, flags=re.M)[1:]:
            field = {key: re.search(rf"^\s*{key}\s*=\s*(.+?)\s*$", block, re.M) for key in
                     ("deviceName", "deviceType", "driverName", "driverInfo", "apiVersion")}
            heap = re.search(r"memoryHeaps\[0\]:.*?size\s*=\s*(\d+)", block, re.S)
            value = {key: m.group(1) if m else None for key, m in field.items()}
            if value["deviceName"]:
                found.append({"name": value["deviceName"], "type": value["deviceType"],
                              "driver": " ".join(v for v in (value["driverName"], value["driverInfo"]) if v),
                              "api_version": value["apiVersion"], "memory_bytes": int(heap.group(1)) if heap else None})
        return found


class OpenCl(DeviceApi):
    """Any OpenCL platform: GPUs' drivers, and pocl on the CPU (TVM falls back to a CPU device)."""

    name = "opencl"
    packages = ("an OpenCL driver (an ICD, e.g. Debian pocl-opencl-icd), clinfo for its listing, and a TVM "
                "built with USE_OPENCL (ocl-icd-opencl-dev)")
    nodes = ("/dev/dri/*", "/dev/nvidia*", "/dev/kfd", "/dev/mali*")

    def devices(self) -> list[dict]:
        out = _output(["clinfo", "--raw"])
        if out is None:
            return []
        devices: dict[str, dict] = {}
        # "[POCL/0]  CL_DEVICE_NAME  pthread-..." : one line per (platform/device, property)
        for tag, key, value in re.findall(r"^\[(\w+/\d+)\]\s+(CL_\w+)\s+(.*?)\s*$", out, re.M):
            device = devices.setdefault(tag, {})
            device[key] = value
        return [{"name": d.get("CL_DEVICE_NAME", tag), "type": d.get("CL_DEVICE_TYPE"),
                 "driver": d.get("CL_DRIVER_VERSION"),
                 "memory_bytes": int(d["CL_DEVICE_GLOBAL_MEM_SIZE"]) if d.get("CL_DEVICE_GLOBAL_MEM_SIZE",
                                                                              "").isdigit() else None}
                for tag, d in sorted(devices.items())]


class Metal(DeviceApi):
    """Apple GPUs through Metal (macOS only)."""

    name = "metal"
    packages = "macOS and a TVM built with USE_METAL"

    def unavailable(self) -> str | None:
        return None if platform.system() == "Darwin" else f"Metal exists only on macOS, not on {platform.system()}"

    def devices(self) -> list[dict]:
        out = _output(["system_profiler", "-json", "SPDisplaysDataType"], timeout_s=60)
        try:
            displays = json.loads(out or "{}").get("SPDisplaysDataType", [])
        except ValueError:
            return []
        return [{"name": d.get("sppci_model", "?"), "driver": d.get("spdisplays_mtlgpufamilysupport"),
                 "memory_bytes": None} for d in displays]


class WebGpu(DeviceApi):
    """WebGPU: TVM runs it only inside a browser (its JavaScript runtime), not in a local process."""

    name = "webgpu"
    packages = "a browser with WebGPU running TVM's web runtime"

    def unavailable(self) -> str | None:
        return ("TVM runs WebGPU kernels only inside a browser through its JavaScript runtime (tvmjs), which "
                "connects to an RPC proxy: use the rpc runner with that proxy's tracker key and a webgpu target")

    def devices(self) -> list[dict]:
        return []


# By the names of core's DEVICE_BACKENDS (a name it lacks is refused), where a tvm-source build
# finds each API's CMake flag too
DEVICE_APIS: Registry[DeviceApi] = Registry(
    "device API", ((api.name, api) for api in (Cuda(), Rocm(), Vulkan(), OpenCl(), Metal(), WebGpu())),
    of=DEVICE_BACKENDS)

# target kinds that compile for an API under another name
_TARGET_KINDS = {"nvptx": "cuda"}


def api_of(target: dict | str | None) -> DeviceApi:
    """The device API a ``[runner] target`` (a dict or a TVM target string) compiles for;
    CUDA when there is none. Raises ValueError for a target of no device API."""
    if target is None:
        return DEVICE_APIS["cuda"]
    kind = target.get("kind") if isinstance(target, dict) else str(target).split()[0] if str(target).strip() else None
    name = _TARGET_KINDS.get(str(kind), str(kind))
    if name not in DEVICE_APIS:
        raise ValueError(f"runner.target: kind {kind!r} is not a device API; expected one of "
                         f"{', '.join(sorted(DEVICE_APIS))}")
    return DEVICE_APIS[name]
