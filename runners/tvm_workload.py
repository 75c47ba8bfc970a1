"""The ``tvm`` workload kind: a model compiled and timed by harness workers in the build's own
Python (``runners/worker/tvm_worker.py``, through the runner's
:class:`~abwatch.runners.tvm_sessions.TvmSessions`), its outputs checked against the other
build's."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from abwatch.core.errors import UsageError
from abwatch.builders.procs import Placement
from abwatch.builders.spec import BuildSpec
from abwatch.builders.workload_spec import SCRIPT_REPO, TvmWorkloadConfig
from abwatch.runners.counters import InstructionCounter
from abwatch.runners.outputs import OutputDiff, first_compiled, output_error
from abwatch.runners.results import InvocationResult, TvmMetrics, WorkerReady
from abwatch.runners.tvm_sessions import TvmSessions
from abwatch.runners.workload_kind import WorkloadKind


class TvmKind(WorkloadKind):
    """A TVM model compiled and timed by harness workers in the build's Python (the runner's
    :class:`~abwatch.runners.tvm_sessions.TvmSessions` knows its device and target)."""

    kind = "tvm"
    config = TvmWorkloadConfig
    times_compiles = True  # every runner (cpu, gpu, rpc) runs it: its sessions know the target
    runs_pinned = True
    threaded = True

    def resolve(self, workload: TvmWorkloadConfig, base_dir: Path) -> TvmWorkloadConfig:
        """An ``onnx:`` path made absolute; a ``script:`` file made absolute, compiled (a syntax
        error is found here, before anything is built) and its SHA-256 read, so that the file's
        content is part of the workload's identity."""
        source_kind, _, path = workload.model.partition(":")
        if source_kind == "onnx" and not Path(path).is_absolute():
            return workload.model_copy(update={"model": "onnx:" + str((base_dir / path).resolve())})
        if source_kind != "script" or workload.model.startswith(SCRIPT_REPO):
            return workload
        script = (base_dir / path).resolve()
        try:
            content = script.read_bytes()
        except OSError as exc:
            raise UsageError(f"model: cannot read {script}: {exc.strerror}") from None
        try:
            compile(content, str(script), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = f":{exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
            raise UsageError(f"model: {script}{line}: {type(exc).__name__}: {getattr(exc, 'msg', exc)}") from None
        digest = hashlib.sha256(content).hexdigest()
        if workload.script_sha256 not in (None, digest):
            raise UsageError(f"model: {script} has SHA-256 {digest}, the config says {workload.script_sha256}")
        return workload.model_copy(update={"model": f"script:{script}", "script_sha256": digest})

    def check_runner(self, workload: TvmWorkloadConfig, runner: str) -> str | None:
        """A model that generates tokens is timed step by step from the worker: not over RPC,
        where every decode step would be a round trip to the board (the network timed)."""
        if runner == "rpc" and workload.generates_tokens():
            return (f"workload {workload.name!r}: {workload.model} times each decode step from the worker; "
                    "it runs on the cpu and gpu runners, not over rpc")
        return super().check_runner(workload, runner)

    def check_build(self, workload: TvmWorkloadConfig, build: BuildSpec) -> str | None:
        """A ``script:repo:`` model needs a ``tvm-source`` build that keeps its file (``build.keep``)."""
        if not workload.model.startswith(SCRIPT_REPO):
            return None
        keep = build.kept_source()
        if keep is None:
            return (f"workload {workload.name!r}: script:repo: reads the build's source tree, "
                    "which only a tvm-source build keeps (use script:<path> for a file here)")
        path = PurePosixPath(workload.model.removeprefix(SCRIPT_REPO))
        if not any(path == PurePosixPath(k) or PurePosixPath(k) in path.parents for k in keep):
            return (f"workload {workload.name!r}: {path} is not under build.keep "
                    f"({', '.join(keep) or 'empty'}): add it there so the build keeps it")
        return None

    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: TvmWorkloadConfig, timeout_s: float,
            side: str, placement: Placement | None = None) -> InvocationResult:
        return tvm.run(artifact_dir, workload, timeout_s, side, workload.overrides(side), placement=placement)

    def compile_time(self, tvm: TvmSessions, artifact_dir: Path, workload: TvmWorkloadConfig, timeout_s: float,
                     side: str) -> InvocationResult:
        return tvm.compile_time(artifact_dir, workload, timeout_s, side, workload.overrides(side))

    def count_instructions(self, tvm: TvmSessions, artifact_dir: Path, workload: TvmWorkloadConfig,
                           timeout_s: float, side: str, counter: InstructionCounter,
                           what: str = "run") -> InvocationResult:
        # A region of the worker is counted (the compile call, or the timed calls), not its
        # start-up: import tvm alone is ~4 G instructions against a compile's ~80 M.
        return tvm.counted(artifact_dir, workload, timeout_s, side, workload.overrides(side), counter, what)

    def record_fields(self, workload: TvmWorkloadConfig, worker: WorkerReady | None) -> tuple[dict, dict, dict]:
        args = {"model": workload.model, "dtype": workload.dtype, "options": workload.options,
                "input_shapes": (worker or {}).get("input_shapes"), "number": workload.number,
                "repeat": workload.samples}
        meta = {"kind": "tvm", "md5": workload.md5,
                **({"script_sha256": workload.script_sha256} if workload.script_sha256 else {})}
        return args, meta, {}

    def check_outputs(self, workload: TvmWorkloadConfig,
                      metrics: Mapping[str, list[TvmMetrics]]) -> OutputDiff | None:
        """The first output tensor of each side's compiling invocation, within ``rtol``/``atol``."""
        first = first_compiled(metrics)
        control, treatment = first.get("control"), first.get("treatment")
        if control is None or treatment is None:
            return None
        return output_error(control["outputs"], treatment["outputs"], workload.rtol, workload.atol)
