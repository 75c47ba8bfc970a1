"""One TVM harness worker process and its conversation: the build's own Python running the
worker's file (``runners/worker/tvm_worker.py``), one JSON object a line each way.

The worker's files are run, never imported: abwatch names them here (:data:`WORKER_DIR`).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from abwatch.core.redact import mask_secrets
from abwatch.builders.environment import ArtifactInfoError, build_environment, build_python
from abwatch.builders.procs import child_env, kill_tree, launch
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import ARTIFACT_INFO

# The worker's side (runners/worker/): files the build's Python runs, never imported here.
WORKER_DIR = Path(__file__).with_name("worker")
WORKER = WORKER_DIR / "tvm_worker.py"
MAX_LINE = 64 * 2**20  # the longest reply line a worker may send (per-operator tables, output tensors)
# How long an ended worker's stderr is waited for: its end of the pipe closes when its process
# (and, sandboxed, every process of its sandbox) is gone, at once unless a process it left holds it.
STDERR_DRAIN_S = 5.0


class WorkerError(Exception):
    """The worker failed, hung or said something that is not the protocol."""


class Worker:
    """One harness worker process and its line-based JSON conversation."""

    def __init__(self, artifact: Path, spec: dict, env: dict[str, str], sandbox: Sandbox,
                 wrap: Callable[[list[str]], list[str]] | None = None, cpus: frozenset[int] | None = None) -> None:
        try:
            python = build_python(artifact)
        except ArtifactInfoError as exc:
            raise WorkerError(str(exc)) from None
        if python is None:
            raise WorkerError(f"{artifact} is not a TVM build (no {ARTIFACT_INFO}): a tvm workload needs "
                              "a tvm-wheel or tvm-source build")
        env = child_env(build_environment(artifact), env)
        argv = [str(python), str(WORKER)]
        argv = wrap(argv) if wrap else argv
        # code under test (a script: workload, the build's own TVM): in the sandbox, with a
        # private TMPDIR removed when the worker is gone
        self._tmp = (tempfile.TemporaryDirectory(prefix="abwatch-tmp-", ignore_cleanup_errors=True)
                     if sandbox.active else None)
        if self._tmp is not None:
            # killed with abwatch: started from the launcher thread, which lives as long as
            # abwatch, since a fork server serves later threads (procs.launch)
            argv = sandbox.wrap(argv, None, self._tmp.name)
        try:
            # a duet's side: on its CPUs from the start (procs.pinned)
            self.proc = launch(argv, cpus, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        except OSError:
            if self._tmp is not None:
                self._tmp.cleanup()
            raise
        # the three pipes were asked for above, so they are there
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.stdin, self.stdout, self.stderr_pipe = self.proc.stdin, self.proc.stdout, self.proc.stderr
        self.lines: queue.Queue = queue.Queue()
        self.closed = False
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        self.send(spec)

    def _pump(self) -> None:
        # read in bounded pieces: a worker printing a gigabyte without a newline costs no memory
        # (a piece with no newline is not JSON: the protocol is broken and the worker killed)
        with self.stdout:  # each reader closes its pipe at end of file: no descriptor outlives the worker
            for line in iter(lambda: self.stdout.readline(MAX_LINE), ""):
                self.lines.put(line)
        self.lines.put(None)

    def _drain(self) -> None:
        with self.stderr_pipe:
            for line in iter(lambda: self.stderr_pipe.readline(65536), ""):
                self.stderr = (self.stderr + [line])[-50:]

    def send(self, obj: dict) -> None:
        """Write one request."""
        try:
            self.stdin.write(json.dumps(obj) + "\n")
            self.stdin.flush()
        except (OSError, ValueError):  # a broken pipe, or one closed by kill()
            raise WorkerError(f"worker exited: {self.tail(ended=True)}") from None

    def receive(self, timeout_s: float) -> dict:
        """Read one reply, or raise WorkerError (hung: killed; crashed; error reply)."""
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerError(f"killed after {timeout_s:g}s timeout") from None
        if line is None:
            self.proc.wait(5)
            raise WorkerError(f"worker {self._ending()}: {self.tail(ended=True)}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self.kill()
            raise WorkerError(f"worker broke the protocol: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerError(f"worker broke the protocol: {line[:200]!r}")
        if "error" in reply:
            raise WorkerError(mask_secrets(str(reply["error"])))
        return reply

    def _ending(self) -> str:
        """How the worker's process ended: killed by a signal (bubblewrap says 128 + N for a
        sandboxed one), or its exit status."""
        code = self.proc.returncode
        number = -code if code is not None and code < 0 else code - 128 if self._tmp and code and code > 128 else 0
        try:
            return f"killed by {signal.Signals(number).name}" if number else f"exited with status {code}"
        except ValueError:
            return f"exited with status {code}"

    def tail(self, ended: bool = False) -> str:
        """The last lines the worker wrote to stderr; ``ended``: the worker is gone, so first
        let its stderr be read to the end (its last words, why it failed, are written just
        before it exits, and the reading thread may not have them yet)."""
        if ended:
            self._drainer.join(STDERR_DRAIN_S)
        return mask_secrets("".join(self.stderr[-10:]).strip()[-2000:])

    def close(self, wait_s: float = 10.0) -> None:
        """Ask the worker to exit; kill it (and its children) if it does not within ``wait_s``."""
        if self.closed:
            return
        self.closed = True
        try:
            self.send({"cmd": "exit"})
            self.proc.wait(wait_s)
        except (WorkerError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def kill(self) -> None:
        """Stop the worker and any children it started."""
        kill_tree(self.proc.pid)
        self.proc.wait()
        with contextlib.suppress(OSError):  # a pipe the worker broke: nothing left to flush
            self.stdin.close()
        if self._tmp is not None:
            self._tmp.cleanup()
