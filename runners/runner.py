"""The runner plug-in interface: prepare a device, run one invocation, tear down.

What a runner returns (:class:`~abwatch.runners.results.InvocationResult`) lives in
:mod:`.results`, below every module a runner is made of, so that this module can import the
workload kinds and the TVM sessions; the device it describes is
:class:`~abwatch.core.device_identity.DeviceInfo`.
"""

from __future__ import annotations

import abc
import socket
from pathlib import Path
from typing import ClassVar

from abwatch.core.sides import CONTROL
from abwatch.core.errors import UsageError
from abwatch.core.device_identity import DeviceInfo
from abwatch.builders.procs import Placement
from abwatch.builders.spec import RunnerConfig
from abwatch.builders.workload_spec import WorkloadSpec
from abwatch.runners.counters import InstructionCounter
from abwatch.runners.results import InvocationResult
from abwatch.runners.tvm_sessions import TvmSessions
from abwatch.runners.workload_kind import WorkloadKind
from abwatch.runners.workloads import WORKLOAD_KINDS


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

    def run(self, artifact_dir: Path, workload: WorkloadSpec,
            timeout_s: float, side: str = CONTROL, placement: Placement | None = None) -> InvocationResult:
        """Run one invocation of ``workload`` with the build in ``artifact_dir``, as its kind
        (:data:`~abwatch.runners.workloads.WORKLOAD_KINDS`) says.

        For TVM workloads an invocation is one fresh worker's timing batch; ``side`` selects
        the workload's ``treatment_options`` for the treatment build. ``placement`` (a duet's
        side) is passed only to kinds that :attr:`~WorkloadKind.runs_pinned`.
        """
        kind = self.kind_of(workload)
        if placement is None:  # as always: kinds of plug-ins that know no placement run too
            return kind.run(self.tvm, artifact_dir, workload, timeout_s, side)
        return kind.run(self.tvm, artifact_dir, workload, timeout_s, side, placement=placement)

    def compile_time(self, artifact_dir: Path, workload: WorkloadSpec,
                     timeout_s: float, side: str = CONTROL) -> InvocationResult:
        """One fresh process that only compiles ``workload`` with the build in ``artifact_dir``;
        its one sample is the compile time in ms (kinds without a compile step refuse)."""
        return self.kind_of(workload).compile_time(self.tvm, artifact_dir, workload, timeout_s, side)

    def count_instructions(self, artifact_dir: Path, workload: WorkloadSpec,
                           timeout_s: float, counter: InstructionCounter, side: str = CONTROL,
                           what: str = "run") -> InvocationResult:
        """One fresh process of ``workload`` under ``counter``; its one sample is the number of
        instructions ``what`` ("run" or "compile") retired (what each kind counts:
        :data:`~abwatch.runners.workloads.WORKLOAD_KINDS`)."""
        return self.kind_of(workload).count_instructions(self.tvm, artifact_dir, workload, timeout_s, side, counter,
                                                         what)

    def kind_of(self, workload: WorkloadSpec) -> WorkloadKind:
        """The kind of ``workload`` (:data:`~abwatch.runners.workloads.WORKLOAD_KINDS`), which
        this runner must be able to run: the config refuses the pair when it is read, this
        refuses a runner handed to a comparison of another config."""
        kind = WORKLOAD_KINDS[workload.kind]
        refusal = kind.check_runner(workload, self.kind)
        if refusal is not None:
            raise UsageError(refusal)
        return kind

    def check_build(self, artifact_dir: Path) -> None:
        """Raise :class:`RunnerUnavailable` when the build in ``artifact_dir`` cannot run on this
        runner's device at all (a GPU backend it was built without); asked before measuring.
        Every build can run on the CPU and over RPC (the board's runtime is its own)."""
        return None

    @abc.abstractmethod
    def teardown(self) -> None:
        """Release the device."""
