"""Runners execute workloads on a device; registered by kind in :data:`RUNNERS`."""

from runners.base import InvocationResult, Runner
from runners.cpu import CpuRunner

RUNNERS: dict[str, type[Runner]] = {
    CpuRunner.kind: CpuRunner,
}

__all__ = ["CpuRunner", "InvocationResult", "Runner", "RUNNERS"]
