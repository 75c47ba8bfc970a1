"""The ``command`` workload kind: any program that prints its samples, run as a local
process with the build's environment (``builders/environment.py``), in the sandbox."""

from __future__ import annotations

import tempfile
from pathlib import Path

from abwatch.builders.environment import ArtifactInfoError, build_environment
from abwatch.builders.procs import Placement, ProcessResult, child_env, ending, passed, run_process
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.workload_spec import CommandWorkloadConfig
from abwatch.runners.counters import COUNTED_ENV, CountError, InstructionCounter
from abwatch.runners.harness import OutputError, parse_output
from abwatch.runners.results import InvocationResult, WorkerReady
from abwatch.runners.tvm_sessions import TvmSessions
from abwatch.runners.workload_kind import WorkloadKind

STDERR_TAIL = 4000  # characters of a failed invocation's stderr kept as its message


class CommandKind(WorkloadKind):
    """A command printing its samples, run as a local process with the build's environment."""

    kind = "command"
    config = CommandWorkloadConfig
    # its process runs on this machine: a GPU or a board is a TVM worker's target, not a command's
    runners = frozenset({"cpu"})
    runs_pinned = True

    def resolve(self, workload: CommandWorkloadConfig, base_dir: Path) -> CommandWorkloadConfig:
        """``cwd``, where given, made absolute against the config file's directory."""
        if workload.cwd is None or Path(workload.cwd).is_absolute():
            return workload
        return workload.model_copy(update={"cwd": str((base_dir / workload.cwd).resolve())})

    def run(self, tvm: TvmSessions, artifact_dir: Path, workload: CommandWorkloadConfig, timeout_s: float,
            side: str, placement: Placement | None = None) -> InvocationResult:
        proc = self._process(artifact_dir, workload, timeout_s, workload.command, placement=placement)
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
                 defaults: dict[str, str] | None = None, writable: tuple[str, ...] = (),
                 placement: Placement | None = None) -> ProcessResult | InvocationResult:
        """Run ``argv`` as the workload's process (pinned and started with the other side as
        ``placement`` says): its finished process, or the failed invocation it makes (an
        :class:`InvocationResult`)."""
        try:
            # a TVM build's Python first on PATH, with its variables: `python bench.py` uses this build
            env = child_env(build_environment(artifact_dir), defaults or {}, passed(workload.pass_env), workload.env)
        except ArtifactInfoError as exc:
            return InvocationResult("error", (), 0.0, str(exc))
        try:
            # sandboxed: the artifact read-only, no network unless [sandbox] network allows it
            proc = run_process(argv, cwd=workload.cwd or artifact_dir, env=env, timeout_s=timeout_s,
                               max_output=workload.output_limit, sandbox=Sandbox(writable=writable),
                               placement=placement)
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
            return InvocationResult("error", (), proc.wall_s, f"{ending(proc)}: {tail}")
        return proc

    def record_fields(self, workload: CommandWorkloadConfig, worker: WorkerReady | None) -> tuple[dict, dict, dict]:
        return {"command": workload.command}, {"kind": "command"}, {"env": workload.env}
