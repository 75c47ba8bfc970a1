"""TVM's device APIs by name (:data:`DEVICE_BACKENDS`): the one list of them.

Both sides of abwatch read it: a tvm-source build asks the built runtime for each API whose
CMake flag its configuration turns on (``builders/tvm_source.py``), and the ``gpu`` runner
drives one (``runners/device_apis.py``: its :class:`~abwatch.runners.device_apis.DeviceApi`
classes, registered by these names and only these). The names are here, below both, because
builders never import runners.
"""

from __future__ import annotations

from dataclasses import dataclass

from abwatch.core.plugins import Registry


@dataclass(frozen=True)
class DeviceBackend:
    """One of TVM's device APIs: ``tvm.device(name)``'s name (the target kind that compiles
    for it), and the CMake flag that builds it into TVM's runtime (None: a build cannot)."""

    name: str
    cmake: str | None


DEVICE_BACKENDS: Registry[DeviceBackend] = Registry("device API", ((backend.name, backend) for backend in (
    DeviceBackend("cuda", "USE_CUDA"),
    DeviceBackend("rocm", "USE_ROCM"),
    DeviceBackend("vulkan", "USE_VULKAN"),
    DeviceBackend("opencl", "USE_OPENCL"),
    DeviceBackend("metal", "USE_METAL"),
    DeviceBackend("webgpu", None),  # TVM runs WebGPU kernels only in a browser (its web runtime)
)))
