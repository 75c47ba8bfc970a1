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
    assert info.name.endswith(re.sub(r"[^\w.-]", "-", first["name"]))
    assert info.runtime_config["target"] == {"kind": target}
    # the same listing as the driver's own tool gives, not a stale or made-up one
    assert gpus == DEVICE_APIS[target].devices()


@pytest.mark.slow
def test_a_build_without_the_backend_is_refused_before_anything_is_timed(capsys, tmp_path, tvm_cache, sqlite_url):
    """The released wheels have no Vulkan backend: a Vulkan comparison of them is refused, naming
    the CMake flag, and stored as a failed run with no invocation (not as two failing sides)."""
    config = write(tmp_path, tvm_cache, MLP, runner='kind = "gpu"\ntarget = {kind = "vulkan"}')
    code, payload, err = compare(capsys, config, sqlite_url, OLD, NEW)
    assert code == 2, (payload, err)
    assert "has no vulkan backend: USE_VULKAN is OFF in its tvm.support.libinfo(); build it with USE_VULKAN=ON" in err
    assert f"TVM {OLD}" in err  # the control is asked first, and named
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.status.value == "failed" and "USE_VULKAN is OFF" in run.error
        assert session.scalar(select(Invocation.id).limit(1)) is None
        assert run.device.hardware_config["device_api"] == "vulkan"
        assert json.dumps(run.device.hardware_config["gpus"])  # the fingerprint is stored with the run
