"""Runners execute workloads on a device; registered by kind in :data:`RUNNERS`, which the
config's ``[runner] kind`` is validated by (:data:`RunnerSection`)."""

from typing import Annotated

from pydantic import PlainValidator, SerializeAsAny

from abwatch.builders.spec import RunnerConfig, RunnerSettings
from abwatch.core.config_base import kind_validator
from abwatch.core.plugins import Registry
from abwatch.runners.runner import Runner, RunnerUnavailable
from abwatch.runners.cpu import CpuRunner
from abwatch.runners.gpu import GpuRunner
from abwatch.runners.results import InvocationResult, TvmMetrics
from abwatch.runners.rpc import RpcRunner
from abwatch.runners.workload_kind import WorkloadKind
from abwatch.runners.workloads import WORKLOAD_KINDS

RUNNERS: Registry[type[Runner]] = Registry(
    "runner", ((runner.kind, runner) for runner in (CpuRunner, GpuRunner, RpcRunner)),
    config=lambda runner: RunnerConfig)  # every runner reads the one [runner] model

# The config's ``[runner]`` section: its kind one of RUNNERS (``cpu`` where it names none)
RunnerSection = Annotated[SerializeAsAny[RunnerConfig], PlainValidator(kind_validator(RUNNERS, "cpu", "runner"))]


def make_runner(config: RunnerSettings) -> Runner:
    """The runner the config's ``runner.kind`` names, for its ``runner`` section."""
    return RUNNERS[config.runner.kind](config.runner)


__all__ = ["CpuRunner", "GpuRunner", "InvocationResult", "RpcRunner", "Runner", "RunnerUnavailable",
           "RUNNERS", "RunnerSection", "TvmMetrics", "WORKLOAD_KINDS", "WorkloadKind", "make_runner"]
