"""Runners execute workloads on a device; registered by kind in :data:`RUNNERS`."""

from runners.base import InvocationResult, Runner
from runners.cpu import CpuRunner

RUNNERS: dict[str, type[Runner]] = {
    CpuRunner.kind: CpuRunner,
}


def make_runner(config) -> Runner:
    """The runner the config's ``runner.kind`` names, for its ``runner`` section."""
    return RUNNERS[config.runner.kind](config.runner)


__all__ = ["CpuRunner", "InvocationResult", "Runner", "RUNNERS", "make_runner"]
