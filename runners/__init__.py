"""Runners execute workloads on a device; registered by kind in :data:`RUNNERS`."""

from abwatch.builders.spec import RunnerSettings
from abwatch.runners.base import Runner, RunnerUnavailable
from abwatch.runners.cpu import CpuRunner
from abwatch.runners.gpu import GpuRunner
from abwatch.runners.results import InvocationResult, TvmMetrics
from abwatch.runners.rpc import RpcRunner
from abwatch.runners.workload_kind import WorkloadKind
from abwatch.runners.workloads import WORKLOAD_KINDS

RUNNERS: dict[str, type[Runner]] = {
    CpuRunner.kind: CpuRunner,
    GpuRunner.kind: GpuRunner,
    RpcRunner.kind: RpcRunner,
}


def make_runner(config: RunnerSettings) -> Runner:
    """The runner the config's ``runner.kind`` names, for its ``runner`` section."""
    return RUNNERS[config.runner.kind](config.runner)


__all__ = ["CpuRunner", "GpuRunner", "InvocationResult", "RpcRunner", "Runner", "RunnerUnavailable",
           "RUNNERS", "TvmMetrics", "WORKLOAD_KINDS", "WorkloadKind", "make_runner"]
