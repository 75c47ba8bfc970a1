"""The runner plug-in interface: prepare a device, run one invocation, tear down."""

from __future__ import annotations

import abc
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from abwatch.builders.spec import CommandWorkloadConfig, RunnerConfig, TvmWorkloadConfig, UsageError

if TYPE_CHECKING:
    from abwatch.runners.counters import InstructionCounter
    from abwatch.runners.tvm_sessions import TvmSessions


class OpFeatures(TypedDict):
    """Shapes and dtypes of an operator's tensor arguments (inputs first, then outputs)."""

    shapes: list[list[int]]
    dtypes: list[str]


class WorkerReady(TypedDict, total=False):
    """What a TVM worker says of itself once its workload is compiled (``runners/tvm_worker.py``)."""

    ready: bool
    compile_ms: float
    tvm_version: str
    target: Any  # the TVM target as the worker printed it
    features: dict[str, bool]  # llvm, cuda, rpc enabled in that TVM
    input_shapes: list[list[int]]
    num_threads: str | None  # $TVM_NUM_THREADS as the worker saw it


class OutputTensor(TypedDict):
    """A workload's first output, as the worker sends it."""

    shape: list[int]
    dtype: str
    data: str  # base64 of the raw bytes


class TvmMetrics(TypedDict, total=False):
    """What one TVM invocation reports beside its samples: per-operator times (µs) and their
    features; the invocation that compiled also its compile time, its worker's self-description
    and its output."""

    ops: dict[str, float]
    op_features: dict[str, OpFeatures]
    compile_ms: float
    ready: WorkerReady
    outputs: OutputTensor


@dataclass(frozen=True)
class InvocationResult:
    """One workload process: its status, its samples (ms) and what it said on failure."""

    status: str  # "ok" | "timeout" | "error" (values of service.store.models.InvocationStatus)
    samples: tuple[float, ...]
    wall_s: float
    message: str = ""
    records: tuple[dict, ...] = field(default_factory=tuple)
    metrics: TvmMetrics = field(default_factory=lambda: TvmMetrics())  # TVM workloads only
    # how contended the process was: CPU seconds it used, and how often the kernel took the CPU
    # from it, over ``usage_wall_s`` seconds of wall time (command workloads: the whole process,
    # from wait4; TVM workers: the timing batch, all ``threads``); None where not measured
    cpu_s: float | None = None
    involuntary_switches: int | None = None
    usage_wall_s: float | None = None  # None: the whole invocation (wall_s)
    threads: int = 1  # threads the measured code ran on (TVM_NUM_THREADS)
    # a counted process: the functions its count was spent in (runners.profiles.Profile.to_dict,
    # per call where its sample is), None where the counter counts no functions
    profile: dict[str, Any] | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """What :meth:`Runner.prepare` says about the device: stored on the device row and in
    every record (``hardware``, ``hardware_config``, ``software_config``, ``runtime_config``)."""

    name: str  # the device's identity in the database
    kind: str  # the runner's kind
    hardware_config: dict[str, Any]
    software_config: dict[str, Any]
    runtime_config: dict[str, Any] = field(default_factory=dict)


class RunnerUnavailable(UsageError):
    """The runner's device is not there (no GPU, tracker unreachable)."""


class Runner(abc.ABC):
    """Runs workloads of one build on one device."""

    kind: ClassVar[str]
    config: RunnerConfig  # the [runner] section it was made with

    @abc.abstractmethod
    def __init__(self, config: RunnerConfig) -> None:
        """Take the ``[runner]`` section (the registry calls every runner this way)."""

    @abc.abstractmethod
    def prepare(self) -> DeviceInfo:
        """Get the device ready; return its description (named :meth:`device_name`)."""

    def device_name(self) -> str:
        """The device's name in the database, the same for a comparison and the watch's jobs:
        ``runner.device`` if the config names one, else what this kind of runner calls it
        (this machine's host name for the local CPU)."""
        return self.config.device or socket.gethostname()

    # Every runner can run TVM workloads; its TVM sessions know its device and target.
    tvm: TvmSessions

    def run(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
            timeout_s: float, side: str = "control") -> InvocationResult:
        """Run one invocation of ``workload`` with the build in ``artifact_dir``, as its kind
        (:data:`~abwatch.runners.workloads.WORKLOAD_KINDS`) says.

        For TVM workloads an invocation is one fresh worker's timing batch; ``side`` selects
        the workload's ``treatment_options`` for the treatment build.
        """
        from abwatch.runners.workloads import WORKLOAD_KINDS  # the kinds run on runners: imported late

        return WORKLOAD_KINDS[workload.kind].run(self, artifact_dir, workload, timeout_s, side)

    def compile_time(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
                     timeout_s: float, side: str = "control") -> InvocationResult:
        """One fresh process that only compiles ``workload`` with the build in ``artifact_dir``;
        its one sample is the compile time in ms (kinds without a compile step refuse)."""
        from abwatch.runners.workloads import WORKLOAD_KINDS

        return WORKLOAD_KINDS[workload.kind].compile_time(self, artifact_dir, workload, timeout_s, side)

    def count_instructions(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
                           timeout_s: float, counter: InstructionCounter, side: str = "control",
                           what: str = "run") -> InvocationResult:
        """One fresh process of ``workload`` under ``counter``; its one sample is the number of
        instructions ``what`` ("run" or "compile") retired (what each kind counts:
        :data:`~abwatch.runners.workloads.WORKLOAD_KINDS`)."""
        from abwatch.runners.workloads import WORKLOAD_KINDS

        return WORKLOAD_KINDS[workload.kind].count_instructions(self, artifact_dir, workload, timeout_s, side, counter,
                                                                what)

    @abc.abstractmethod
    def teardown(self) -> None:
        """Release the device."""
