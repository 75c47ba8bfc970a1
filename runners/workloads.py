"""Workload kinds: how a runner runs each kind of workload, registered by name in
:data:`WORKLOAD_KINDS` (as builders are in ``BUILDERS`` and runners in ``RUNNERS``).

A new kind of workload is one class here and its config model in ``builders/spec.py``: the
runners, the compile-time measurement and the records ask the registry, never ``kind ==``.
"""

from __future__ import annotations

import abc
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from abwatch.builders.environment import ArtifactInfoError, build_environment
from abwatch.builders.procs import ProcessResult, child_env, passed, run_process
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import CommandWorkloadConfig, TvmWorkloadConfig
from abwatch.runners.counters import COUNTED_ENV, CountError, InstructionCounter
from abwatch.runners.harness import OutputError, parse_output
from abwatch.runners.results import InvocationResult, WorkerReady
from abwatch.runners.tvm_sessions import TvmSessions

STDERR_TAIL = 4000  # characters of a failed invocation's stderr kept as its message


class WorkloadKind(abc.ABC):
    """How one kind of workload is run, timed and described."""

    kind: ClassVar[str]
    times_compiles: ClassVar[bool] = False  # whether compile_time() measures anything

    @abc.abstractmethod
    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: Any, timeout_s: float,
            side: str) -> InvocationResult:
        """One invocation of ``workload`` with the build in ``artifact_dir`` on the runner whose
        TVM sessions are ``tvm`` (kinds that run no TVM worker leave them alone)."""

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


class CommandKind(WorkloadKind):
    """A command printing its samples, run as a local process with the build's environment."""

    kind = "command"

    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: CommandWorkloadConfig, timeout_s: float,
            side: str) -> InvocationResult:
        proc = self._process(artifact_dir, workload, timeout_s, workload.command)
        if isinstance(proc, InvocationResult):
            return proc
        try:
            samples, records = parse_output(proc.stdout, max_samples=workload.samples_limit)
        except OutputError as exc:
            return InvocationResult("error", (), proc.wall_s, str(exc))
        return InvocationResult("ok", samples, proc.wall_s, "", records, cpu_s=proc.cpu_s,
                                involuntary_switches=proc.involuntary_switches, max_rss_kb=proc.max_rss_kb)

    def count_instructions(self, tvm: TvmSessions, artifact_dir: Path, workload: CommandWorkloadConfig,
                           timeout_s: float, side: str, counter: InstructionCounter,
                           what: str = "run") -> InvocationResult:
        if what != "run":
            raise NotImplementedError(f"command workloads have no compile step to count ({workload.name!r})")
        # The whole process is counted: its start-up is the same on both sides, so it dilutes a
        # change but cannot fake one; what it prints is not read.
        with tempfile.TemporaryDirectory(prefix="abwatch-count-") as scratch:
            argv = counter.wrap(list(workload.command), Path(scratch))
            proc = self._process(artifact_dir, workload, timeout_s, argv, COUNTED_ENV, writable=(scratch,))
            if isinstance(proc, InvocationResult):
                return proc
            try:
                count = counter.read(Path(scratch))
            except CountError as exc:
                return InvocationResult("error", (), proc.wall_s, f"{counter.name}: {exc}")
            profile = counter.profile(Path(scratch))
        return InvocationResult("ok", (float(count),), proc.wall_s, profile=profile.to_dict() if profile else None)

    @staticmethod
    def _process(artifact_dir: Path, workload: CommandWorkloadConfig, timeout_s: float, argv: list[str],
                 defaults: dict[str, str] | None = None, writable: tuple[str, ...] = ()) -> ProcessResult | InvocationResult:
        """Run ``argv`` as the workload's process: its finished process, or the failed
        invocation it makes (an :class:`InvocationResult`)."""
        try:
            # a TVM build's Python first on PATH, with its variables: `python bench.py` uses this build
            env = child_env(build_environment(artifact_dir), defaults or {}, passed(workload.pass_env), workload.env)
        except ArtifactInfoError as exc:
            return InvocationResult("error", (), 0.0, str(exc))
        try:
            # sandboxed: the artifact read-only, no network unless [sandbox] network allows it
            proc = run_process(argv, cwd=workload.cwd or artifact_dir, env=env, timeout_s=timeout_s,
                               max_output=workload.output_limit, sandbox=Sandbox(writable=writable))
        except OSError as exc:
            return InvocationResult("error", (), 0.0, f"cannot start {argv[0]!r}: {exc.strerror}")
        if proc.overflowed:
            return InvocationResult("error", (), proc.wall_s,
                                    f"printed more than {workload.output_limit} bytes; killed, nothing of it kept "
                                    f"(raise workloads.{workload.name}.max_output_mb if that much is expected)")
        if proc.timed_out:
            return InvocationResult("timeout", (), proc.wall_s, f"killed after {timeout_s:g}s timeout")
        if proc.returncode != 0:
            tail = proc.stderr[-STDERR_TAIL:].strip()
            return InvocationResult("error", (), proc.wall_s, f"exited with status {proc.returncode}: {tail}")
        return proc

    def record_fields(self, workload: CommandWorkloadConfig, worker: WorkerReady | None) -> tuple[dict, dict, dict]:
        return {"command": workload.command}, {"kind": "command"}, {"env": workload.env}


class TvmKind(WorkloadKind):
    """A TVM model compiled and timed by harness workers in the build's Python (the runner's
    :class:`~abwatch.runners.tvm_sessions.TvmSessions` knows its device and target)."""

    kind = "tvm"
    times_compiles = True

    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: TvmWorkloadConfig, timeout_s: float,
            side: str) -> InvocationResult:
        return tvm.run(artifact_dir, workload, timeout_s, side, workload.overrides(side))

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


WORKLOAD_KINDS: dict[str, WorkloadKind] = {
    CommandKind.kind: CommandKind(),
    TvmKind.kind: TvmKind(),
}
