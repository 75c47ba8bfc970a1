"""In a TVM worker (the build's own Python): what a device other than the CPU needs.

Loaded by ``tvm_worker.py`` as a sibling module, and by path in a build's Python by the gpu
runner's backend question (:func:`backend` and :func:`refusal`); abwatch never imports it (it
imports no TVM at the top, only numpy). It checks that the build can drive the device, gives hand-written kernels without a GPU schedule
TVM's default one, and compares the device's output with the same build's CPU output, so a
kernel that computes the wrong thing fast is a failure, not a speed-up.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

# how far the device's output may be from the CPU's: float32 kernels that sum in another
# order (a GPU's reduction trees, fused multiply-adds) differ by a few ulps per term
RTOL, ATOL = 1e-3, 1e-4


def _flag(api: str) -> str:
    """The CMake flag that builds device API ``api`` into TVM (its key in tvm.support.libinfo();
    builders/tvm_source.py's post-build check follows the same rule)."""
    return f"USE_{api.upper()}"


def _runtime_library(api: str) -> str | None:
    """The build's ``libtvm_runtime_<api>.so`` beside the ``libtvm_runtime.so`` this process
    loaded (where TVM keeps a device API's runtime apart), or None where there is none."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            loaded = [line.split()[-1] for line in maps if line.rstrip().endswith("/libtvm_runtime.so")]
    except OSError:  # not Linux: nothing to look at
        return None
    for runtime in loaded[:1]:
        candidate = os.path.join(os.path.dirname(runtime), f"libtvm_runtime_{api}.so")
        if os.path.exists(candidate):
            return candidate
    return None


def backend(tvm, api: str) -> dict:
    """What this build says of device API ``api``: whether its runtime has it (the one fact
    that decides: ``tvm.support.libinfo()`` of recent TVM is a Python fallback that reports
    defaults, not the build), the runtime library kept apart for it, and whether a device is
    there."""
    enabled = bool(tvm.runtime.enabled(api))
    try:
        libinfo = str(tvm.support.libinfo().get(_flag(api), "absent"))
    except Exception:  # noqa: BLE001 - a hint only; builds without it still answer
        libinfo = "unknown"
    return {"tvm": tvm.__version__, "enabled": enabled, "exist": bool(enabled and tvm.device(api).exist),
            "library": _runtime_library(api), "libinfo": libinfo}


def refusal(api: str, said: dict, need_device: bool = True) -> str | None:
    """Why a build that said ``said`` (:func:`backend`) cannot run on ``api``; None if it can."""
    flag = _flag(api)
    if not said["enabled"]:
        if said["library"]:
            return (f"its {api} runtime ({os.path.basename(said['library'])}) did not load: the driver's library "
                    "is missing on this machine")
        return (f"it has no {api} backend (tvm.runtime.enabled({api!r}) is False, no libtvm_runtime_{api}.so; "
                f"tvm.support.libinfo() says {flag}={said['libinfo']}): build TVM with {flag}=ON")
    if need_device and not said["exist"]:
        return f"it has the {api} backend but the driver lists no {api} device on this machine"
    return None


def check(tvm, device: str, need_device: bool = True) -> None:
    """Raise RuntimeError naming what is missing when this build cannot run on ``device`` (when
    ``need_device`` is false, as for a compile alone, only the backend must be there)."""
    if device == "opencl":  # pocl compiles kernels into $HOME by default, read-only in the sandbox
        os.environ.setdefault("POCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "pocl-cache"))
    why = refusal(device, backend(tvm, device), need_device)
    if why is not None:
        raise RuntimeError(f"this TVM build cannot run on {device}: {why}")


def describe(dev) -> dict:
    """The device as TVM sees it: name, driver, memory, limits (what its runtime reports)."""
    info = {}
    for name in ("device_name", "driver_version", "total_global_memory", "max_threads_per_block",
                 "max_shared_memory_per_block", "compute_version", "warp_size"):
        try:
            value = getattr(dev, name)
        except Exception:  # noqa: BLE001 - an attribute this API or TVM version lacks
            continue
        if value is not None:
            info[name] = value if isinstance(value, (int, float, str)) else str(value)
    return info


def _unscheduled(func) -> bool:
    # A kernel bound to GPU threads already (a script's own schedule) keeps its schedule;
    # the printed TVMScript is the one form every TVM version shares for asking that.
    text = func.script()
    return not any(word in text for word in ("thread_binding", "launch_thread", "blockIdx", "threadIdx"))


def schedule(tvm, mod, target):
    """``mod`` (TIR functions) with TVM's default GPU schedule (dlight) for each function
    not bound to GPU threads yet; Relax modules get theirs from ``tvm.compile``'s pipeline."""
    try:
        from tvm.s_tir import dlight as dl
    except ImportError:  # releases before the s_tir package
        from tvm import dlight as dl
    if not any(_unscheduled(func) for func in mod.functions.values()):
        return mod
    # a new module: the pass updates the module it is given in place, and the caller keeps the
    # unscheduled one for the CPU reference
    mod = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)


def cpu_output(workload, mod) -> np.ndarray:
    """The first output of ``mod`` (a ``tvm_worker.Workload``'s module before any GPU schedule)
    compiled for this host's CPU and run on the workload's inputs."""
    tvm = workload.tvm
    cpu = tvm.cpu()
    lib = tvm.compile(mod, target="llvm")
    args = [tvm.runtime.tensor(x, cpu) for x in workload.inputs + list(workload.params)]
    if workload.is_vm:
        from tvm import relax

        result = workload.callable(relax.VirtualMachine(lib, cpu), cpu)(*args)  # a generation's too
        while not hasattr(result, "numpy"):  # tuples of outputs: the first, as the device's
            result = result[0]
    else:  # a PrimFunc writes into its last argument: start from what the device's started from
        initial = (workload.out_array if workload.out_array is not None  # the array a script gave
                   else np.zeros(workload.out_shape, workload.spec["dtype"]))
        result = tvm.runtime.tensor(initial, cpu)
        getattr(lib, "mod", lib)[workload.entry](*args, result)
    return result.numpy().astype(np.float32)


def reference_error(expected: np.ndarray, actual: np.ndarray) -> dict:
    """How far the device's output is from the CPU's (``ok`` within :data:`RTOL`/:data:`ATOL`)."""
    expected, actual = expected.astype(np.float64), actual.astype(np.float64)
    if expected.shape != actual.shape:
        return {"ok": False, "why": f"shape {list(actual.shape)} on the device, {list(expected.shape)} on the CPU"}
    diff = np.abs(expected - actual)
    worst = float(diff.max()) if diff.size else 0.0
    ok = bool(np.all(diff <= ATOL + RTOL * np.abs(expected)))
    return {"ok": ok, "max_abs_error": worst, "rtol": RTOL, "atol": ATOL}
