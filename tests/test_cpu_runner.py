"""The local CPU runner on real processes: samples, failures, and hung workloads killed whole."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import NVIDIA_HERE
from abwatch.runners import CpuRunner
from abwatch.service.config import CommandWorkloadConfig, RunnerConfig


def workload(*command, **kw) -> CommandWorkloadConfig:
    return CommandWorkloadConfig(name="w", command=list(command), **kw)


def test_samples_and_device_description(tmp_path):
    runner = CpuRunner(RunnerConfig(device="test-device"))
    info = runner.prepare()
    assert info.name == "test-device" and info.kind == "cpu"
    assert info.hardware_config["cpu_count"] >= 1 and info.hardware_config["memory_GB"] > 0
    assert "sqlalchemy" in info.software_config["pip"]
    result = runner.run(tmp_path, workload("sh", "-c", 'echo "{\\"runtime_ms\\": $X}"; echo "{\\"runtime_ms\\": 2}"',
                                           env={"X": "1.5"}), 10)
    assert result.status == "ok" and result.samples == (1.5, 2.0)
    runner.teardown()


def test_relative_command_runs_in_the_artifact_directory(tmp_path):
    script = tmp_path / "bench"
    script.write_text('#!/bin/sh\necho \'{"runtime_ms": 4}\'\n')
    script.chmod(0o755)
    assert CpuRunner().run(tmp_path, workload("./bench"), 10).samples == (4.0,)


def test_failure_keeps_the_message(tmp_path):
    result = CpuRunner().run(tmp_path, workload("sh", "-c", "echo boom >&2; exit 3"), 10)
    assert result.status == "error" and "status 3" in result.message and "boom" in result.message
    result = CpuRunner().run(tmp_path, workload("sh", "-c", "echo not-json"), 10)
    assert result.status == "error" and "not JSON" in result.message
    result = CpuRunner().run(tmp_path, workload("./does-not-exist"), 10)
    assert result.status == "error" and "cannot start" in result.message


def test_hung_workload_and_its_children_are_killed(tmp_path):
    marker = "97.4321"  # a unique sleep argument to find the grandchild by
    start = time.monotonic()
    result = CpuRunner().run(tmp_path, workload("sh", "-c", f"sleep {marker} & sleep {marker}; wait"), 0.5)
    assert result.status == "timeout" and "0.5s timeout" in result.message
    assert time.monotonic() - start < 10
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_one_device_name_for_comparisons_and_the_watch():
    """A runner names its device once (Runner.device_name): the row a comparison stores and the
    device the watch queues jobs for are the same, for each kind of runner."""
    import socket

    from abwatch.builders.spec import RunnerConfig
    from abwatch.runners import GpuRunner, RpcRunner, RunnerUnavailable
    from abwatch.service.watch.device_config import device_names
    from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig

    def config(runner: RunnerConfig) -> Config:
        return Config(build=TvmWheelBuildConfig(), runner=runner,
                      workloads=[TvmWorkloadConfig(name="m", model="builtin:mlp")])

    assert CpuRunner(RunnerConfig()).device_name() == socket.gethostname()
    assert device_names(config(RunnerConfig())) == [socket.gethostname()]
    rpc = RunnerConfig(kind="rpc", tracker="127.0.0.1:9190", key="rk3399")
    assert RpcRunner(rpc).device_name() == "rk3399" == device_names(config(rpc))[0]
    named = RunnerConfig(kind="rpc", tracker="127.0.0.1:9190", key="rk3399", device="board-7")
    assert device_names(config(named)) == ["board-7"] == [RpcRunner(named).device_name()]
    # no GPU here (none is lent to CI): the gpu runner refuses to name a device it does not have
    if not NVIDIA_HERE:
        with pytest.raises(RunnerUnavailable, match="no cuda device"):
            GpuRunner(RunnerConfig(kind="gpu")).device_name()
    assert GpuRunner(RunnerConfig(kind="gpu", device="gpu-box")).device_name() == "gpu-box"
