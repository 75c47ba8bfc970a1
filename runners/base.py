"""The runner plug-in interface: prepare a device, run one invocation, tear down."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from abwatch.builders.spec import CommandWorkloadConfig, TvmWorkloadConfig


@dataclass(frozen=True)
class InvocationResult:
    """One workload process: its status, its samples (ms) and what it said on failure."""

    status: str  # "ok" | "timeout" | "error" (values of service.models.InvocationStatus)
    samples: tuple[float, ...]
    wall_s: float
    message: str = ""
    records: tuple[dict, ...] = field(default_factory=tuple)
    metrics: dict = field(default_factory=dict)  # tvm: compile_ms, per-op times, outputs


class RunnerUnavailable(Exception):
    """The runner's device is not there (no GPU, tracker unreachable)."""


class Runner(abc.ABC):
    """Runs workloads of one build on one device."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def prepare(self) -> dict:
        """Get the device ready; return its description (name, hardware and software config)."""

    @abc.abstractmethod
    def run(self, artifact_dir: Path, workload: CommandWorkloadConfig | TvmWorkloadConfig,
            timeout_s: float, side: str = "control") -> InvocationResult:
        """Run one invocation of ``workload`` with the build in ``artifact_dir``.

        For TVM workloads an invocation is one timing batch of a long-lived worker; ``side``
        selects the workload's ``treatment_options`` for the treatment build.
        """

    @abc.abstractmethod
    def teardown(self) -> None:
        """Release the device."""
