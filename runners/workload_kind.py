"""The workload-kind plug-in interface: everything abwatch knows about one kind of workload.

A kind (``command``, ``tvm``, or a new one) is one subclass of :class:`WorkloadKind` in its
own module, registered by name in :data:`abwatch.runners.workloads.WORKLOAD_KINDS`. It owns

- its config model (:attr:`WorkloadKind.config`, a subclass of
  :class:`~abwatch.builders.workload_spec.WorkloadSpec`): the config's ``[[workloads]]``
  entries are validated by the model their ``kind`` names;
- its local paths, made absolute against the config file's directory (:meth:`~WorkloadKind.resolve`);
- which runners can run it, and what the rest of the config must provide for it
  (:meth:`~WorkloadKind.check_runner`, :meth:`~WorkloadKind.check_build`);
- how an invocation runs, times its compile step and counts instructions, and what its
  records say (:meth:`~WorkloadKind.run`, ...);
- its correctness check: the treatment's outputs against the control's (:meth:`~WorkloadKind.check_outputs`).

Nothing outside a kind's module asks which kind a workload is (``tests/test_layers.py``
refuses an ``isinstance`` on a workload model, or a ``workload.kind ==``, elsewhere): it asks
the registry.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from abwatch.builders.procs import Placement
from abwatch.builders.spec import BuildSpec
from abwatch.builders.workload_spec import WorkloadSpec
from abwatch.runners.counters import InstructionCounter
from abwatch.runners.outputs import OutputDiff
from abwatch.runners.results import InvocationResult, TvmMetrics, WorkerReady
from abwatch.runners.tvm_sessions import TvmSessions


class WorkloadKind(abc.ABC):
    """How one kind of workload is configured, checked, run, timed and described.

    ``workload`` arguments are instances of the kind's own :attr:`config` model (typed
    ``Any`` here so that each kind's methods can name its model).
    """

    kind: ClassVar[str]  # the name in the config (``kind = "..."``) and in WORKLOAD_KINDS
    config: ClassVar[type[WorkloadSpec]]  # the model of its [[workloads]] entries
    # The runner kinds (RUNNERS' names) that can run it; None: every runner.
    runners: ClassVar[frozenset[str] | None] = None
    times_compiles: ClassVar[bool] = False  # whether compile_time() measures anything
    # whether run() takes a ``placement`` (a duet's side: pinned CPUs, started with the other
    # side); a kind without it is measured interleaved under ``[run] schedule = "duet"``
    runs_pinned: ClassVar[bool] = False
    # whether its measured processes run on TVM_NUM_THREADS threads (its config's ``threads``,
    # else ``[runner] threads``: RunnerConfig.measured_threads), which its verdicts' notes say
    threaded: ClassVar[bool] = False

    # --- the config -------------------------------------------------------------------------

    def resolve(self, workload: Any, base_dir: Path) -> WorkloadSpec:
        """``workload`` with its local paths made absolute against ``base_dir`` (the config
        file's directory), and whatever else must be read when the config is read; raises
        :class:`~abwatch.core.errors.UsageError` whose message starts with the key at fault
        (``model: cannot read ...``). Kinds without paths return it as it is."""
        return workload

    def check_runner(self, workload: Any, runner: str) -> str | None:
        """Why a ``runner`` runner cannot run ``workload`` (naming both), or None when it can."""
        if self.runners is None or runner in self.runners:
            return None
        return (f"workload {workload.name!r}: the {runner} runner cannot run {self.kind} workloads "
                f"(they run on: {', '.join(sorted(self.runners))})")

    def check_build(self, workload: Any, build: BuildSpec) -> str | None:
        """Why the config's ``[build]`` cannot serve ``workload`` (naming both), or None."""
        return None

    # --- running ----------------------------------------------------------------------------

    @abc.abstractmethod
    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: Any, timeout_s: float,
            side: str, placement: Placement | None = None) -> InvocationResult:
        """One invocation of ``workload`` with the build in ``artifact_dir`` on the runner whose
        TVM sessions are ``tvm`` (kinds that run no TVM worker leave them alone); a kind that
        :attr:`runs_pinned` starts its measured process as ``placement`` says."""

    def compile_time(self, tvm: TvmSessions, artifact_dir: Path, workload: Any, timeout_s: float,
                     side: str) -> InvocationResult:
        """One fresh process that only compiles ``workload``; its one sample is the compile time (ms)."""
        raise NotImplementedError(f"{self.kind} workloads have no compile step to time ({workload.name!r})")

    def count_instructions(self, tvm: TvmSessions, artifact_dir: Path, workload: Any, timeout_s: float,
                           side: str, counter: InstructionCounter, what: str = "run") -> InvocationResult:
        """One fresh process of ``workload`` counted by ``counter``; its one sample is the
        instructions ``what`` ("run", or "compile" where :attr:`times_compiles`) retired."""
        raise NotImplementedError(f"{self.kind} workloads cannot be counted yet ({workload.name!r})")

    @abc.abstractmethod
    def record_fields(self, workload: Any, worker: WorkerReady | None) -> tuple[dict, dict, dict]:
        """What a TVM v0.1 record says of the workload: (workload_args, workload_metadata,
        runtime_config additions)."""

    # --- judging ----------------------------------------------------------------------------

    def check_outputs(self, workload: Any, metrics: Mapping[str, list[TvmMetrics]]) -> OutputDiff | None:
        """The treatment's output against the control's, within the workload's tolerance, from
        each side's invocation metrics; None where the kind's outputs are not compared (or a
        side reported none). A mismatch opens a ``correctness`` regression."""
        return None
