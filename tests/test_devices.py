"""The gpu runner over TVM's device APIs, on the real drivers this machine has.

There is no GPU here, but two real non-CPU drivers are (installed by scripts/test.sh): Mesa's
lavapipe, a conformant Vulkan driver, and pocl, an OpenCL one, both running on the CPU. What
needs a GPU itself (timing CUDA kernels) is run by benchmarks/gpu_check.sh where one is lent;
a TVM built with Vulkan or OpenCL is a source build (docs/devices.md), too slow for the tests.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from tests.conftest import NVIDIA_HERE
from abwatch.builders.spec import RunnerConfig
from abwatch.runners import GpuRunner, RunnerUnavailable
from abwatch.runners.device_apis import DEVICE_APIS, api_of
from abwatch.service.store import db
from abwatch.service.store.models import Invocation, Run

from tests.test_tvm import MLP, NEW, OLD, compare, write


def test_the_target_picks_the_device_api():
    assert api_of(None).name == "cuda"
    assert api_of({"kind": "vulkan"}).name == "vulkan"
    assert api_of("opencl -device=mali").name == "opencl"
    assert api_of({"kind": "nvptx"}).name == "cuda"
    with pytest.raises(ValueError, match=r"runner.target: kind 'llvm' is not a device API; expected one of cuda, "):
        api_of("llvm -mcpu=native")
    with pytest.raises(RunnerUnavailable, match="kind 'c' is not a device API"):
        GpuRunner(RunnerConfig(kind="gpu", target={"kind": "c"}))


def test_a_device_api_without_a_device_here_is_refused_by_name():
    # no NVIDIA driver, no ROCm, not macOS on this machine: each refusal says what was looked for
    if not NVIDIA_HERE:
        with pytest.raises(RunnerUnavailable, match=r"no cuda device on this machine .*nvidia-smi"):
            GpuRunner(RunnerConfig(kind="gpu")).prepare()
    with pytest.raises(RunnerUnavailable, match=r"no rocm device .*rocminfo"):
        GpuRunner(RunnerConfig(kind="gpu", target={"kind": "rocm"})).prepare()
    with pytest.raises(RunnerUnavailable, match=r"\(metal\): Metal exists only on macOS, not on Linux"):
        GpuRunner(RunnerConfig(kind="gpu", target="metal")).prepare()
    with pytest.raises(RunnerUnavailable, match=r"\(webgpu\): .*inside a browser.*rpc runner"):
        GpuRunner(RunnerConfig(kind="gpu", target={"kind": "webgpu"})).device_name()


@pytest.mark.parametrize(("target", "driver"), [("vulkan", "Mesa"), ("opencl", "pocl|debian|\\d")])
def test_the_drivers_devices_are_the_fingerprint(target, driver):
    """lavapipe and pocl are real drivers: their listing is what a run's device records."""
    import re

    runner = GpuRunner(RunnerConfig(kind="gpu", target={"kind": target}))
    info = runner.prepare()
    gpus = info.hardware_config["gpus"]
    assert info.hardware_config["device_api"] == target and gpus, info.hardware_config
    first = gpus[0]
    assert first["name"] and re.search(driver, first["driver"] or ""), first
    assert first["memory_bytes"] and first["memory_bytes"] > 2**20, first  # bytes, not MiB or a string
    # named by the model alone: lavapipe's "(LLVM 15.0.6, 256 bits)" would change with Mesa
    model = re.sub(r"\s*\(.*?\)", "", first["name"]).strip()
    assert info.name.endswith(re.sub(r"[^\w.-]", "-", model)) and "(" not in info.name and "LLVM" not in info.name
    assert info.runtime_config["target"] == {"kind": target}
    # the same listing as the driver's own tool gives, not a stale or made-up one (but for the
    # memory of a device that is this host's CPU: pocl sizes it from the memory free right now)
    on_the_host = "CPU" in (first["type"] or "")
    def identity(listing):
        return [{k: v for k, v in d.items() if k != "memory_bytes" or not on_the_host} for d in listing]
    assert identity(gpus) == identity(DEVICE_APIS[target].devices())
    # so such a device's memory is left out of the fingerprint, or a load would start a new series
    assert (info.fingerprint["gpus"][0].get("memory_gib") is None) == on_the_host, info.fingerprint
    # and the device's fingerprint (a new series when it changes) names it, its driver and the target
    assert info.fingerprint["gpus"][0]["name"] == first["name"] and info.fingerprint["gpus"][0]["driver"] == first["driver"]
    assert info.fingerprint["device_api"] == target and info.fingerprint["target"].split()[0] == target


@pytest.mark.slow
def test_a_build_without_the_backend_is_refused_before_anything_is_timed(capsys, tmp_path, tvm_cache, sqlite_url):
    """The released wheels have no Vulkan backend: a Vulkan comparison of them is refused, naming
    the CMake flag, and stored as a failed run with no invocation (not as two failing sides)."""
    config = write(tmp_path, tvm_cache, MLP, runner='kind = "gpu"\ntarget = {kind = "vulkan"}')
    code, payload, err = compare(capsys, config, sqlite_url, OLD, NEW)
    assert code == 2, (payload, err)
    assert ("cannot run on vulkan: it has no vulkan backend (tvm.runtime.enabled('vulkan') is False, no "
            "libtvm_runtime_vulkan.so; tvm.support.libinfo() says USE_VULKAN=OFF): build TVM with USE_VULKAN=ON") in err
    assert f"TVM {OLD}" in err  # the control is asked first, and named
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.status.value == "failed" and "build TVM with USE_VULKAN=ON" in run.error
        assert session.scalar(select(Invocation.id).limit(1)) is None
        assert run.device.hardware_config["device_api"] == "vulkan"
        assert json.dumps(run.device.hardware_config["gpus"])  # the fingerprint is stored with the run


WORKER_SIDE = r"""
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("worker_device", sys.argv[1])
wd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd)
import tvm
from tvm import te
a, b = te.placeholder((64, 64), "float32", "A"), te.placeholder((64, 64), "float32", "B")
k = te.reduce_axis((0, 64), "k")
c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
target = tvm.target.Target("cuda")
scheduled = wd.schedule(tvm, mod, target)
# the module given stays unscheduled: it is what the CPU reference compiles
said = {"before": wd._unscheduled(mod["main"]), "after": wd._unscheduled(scheduled["main"]),
        "again_same": wd.schedule(tvm, scheduled, target) is scheduled}
# the compile needs no GPU: TVM's CUDA code generator writes the kernel's source, which a build
# without the CUDA toolkit keeps in the module it returns (never loaded here)
sources = []
try:
    built = tvm.compile(scheduled, target=target)
    said["compiled"] = True
    host = getattr(built, "mod", built)
    for module in list(getattr(host, "imports", None) or getattr(host, "imported_modules", None) or []):
        sources.append(module.inspect_source())
except Exception as exc:
    said["compiled"] = f"{type(exc).__name__}: {str(exc)[-200:]}"
said["cuda_source"] = [("__global__" in code, "threadIdx" in code) for code in sources]
for api in ("vulkan", "cuda"):
    try:
        wd.check(tvm, api)
        said[api] = "ok"
    except RuntimeError as exc:
        said[api] = str(exc)
x = np.ones((4, 4), "float32")
said["close"] = wd.reference_error(x, x + 1e-6)
said["far"] = wd.reference_error(x, x * 1.01)
said["shape"] = wd.reference_error(x, x[:2])
print(json.dumps(said))
"""


@pytest.mark.slow
def test_the_workers_device_side_with_the_real_wheel(tvm_python):
    """dlight schedules an unscheduled kernel (and leaves a scheduled one alone), the missing
    backend is named, and the CPU reference check tells a few ulps from a wrong result."""
    import subprocess

    from abwatch.runners.gpu import DEVICE_FILE

    out = subprocess.run([tvm_python, "-c", WORKER_SIDE, str(DEVICE_FILE)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["before"] is True and said["after"] is False and said["again_same"] is True, said
    # the scheduled kernel became CUDA source bound to threads (no toolkit needed for that)
    assert said["compiled"] is True and said["cuda_source"] == [[True, True]], said
    assert said["vulkan"] == ("this TVM build cannot run on vulkan: it has no vulkan backend (tvm.runtime.enabled("
                              "'vulkan') is False, no libtvm_runtime_vulkan.so; tvm.support.libinfo() says "
                              "USE_VULKAN=OFF): build TVM with USE_VULKAN=ON")
    # the wheel keeps a CUDA runtime apart; with no NVIDIA driver here it does not load
    assert NVIDIA_HERE or said["cuda"] == ("this TVM build cannot run on cuda: its cuda runtime (libtvm_runtime_cuda.so) did not "
                            "load: the driver's library is missing on this machine"), said
    assert said["close"]["ok"] is True and said["far"]["ok"] is False and said["far"]["max_abs_error"] > 0.009
    assert said["shape"] == {"ok": False, "why": "shape [2, 4] on the device, [4, 4] on the CPU"}
