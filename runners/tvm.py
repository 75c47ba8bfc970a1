"""Sessions with TVM harness workers: one long-lived worker per (build, workload).

A worker (``runners/tvm_worker.py``) runs in the build's own Python, compiles the
workload once and then answers timing batches; the runner interleaves batches of the
control and treatment workers in the harness's balanced order. A worker that fails to
compile, crashes or exceeds its time is killed and reported as that build's failure.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

from runners.base import InvocationResult
from service.config import RunnerConfig, TvmWorkloadConfig

WORKER = Path(__file__).with_name("tvm_worker.py")
ARTIFACT_INFO = "abwatch-artifact.json"
COMPILE_TIMEOUT_S = 600.0


class WorkerError(Exception):
    """The worker failed, hung or said something that is not the protocol."""


class Worker:
    """One harness worker process and its line-based JSON conversation."""

    def __init__(self, artifact: Path, spec: dict, env: dict[str, str]) -> None:
        info = json.loads((artifact / ARTIFACT_INFO).read_text())
        python = artifact / info["python"]
        env = dict(os.environ, **info.get("env", {}), **env)
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        self.send(spec)

    @staticmethod
    def _pump(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr = (self.stderr + [line])[-50:]

    def send(self, obj: dict) -> None:
        """Write one request."""
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"worker exited: {self.tail()}") from None

    def receive(self, timeout_s: float) -> dict:
        """Read one reply, or raise WorkerError (hung: killed; crashed; error reply)."""
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerError(f"killed after {timeout_s:g}s timeout") from None
        if line is None:
            self.proc.wait(5)
            raise WorkerError(f"worker exited with status {self.proc.returncode}: {self.tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def tail(self) -> str:
        """The last lines the worker wrote to stderr."""
        return "".join(self.stderr[-10:]).strip()[-2000:]

    def kill(self) -> None:
        """Stop the worker and any children it started."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


class TvmSessions:
    """Keeps one worker per (artifact, workload) for a runner, started on first use."""

    def __init__(self, config: RunnerConfig, target: dict, device: str, rpc: dict | None = None) -> None:
        self.config, self.target, self.device, self.rpc = config, target, device, rpc
        self.workers: dict[tuple[Path, str], Worker] = {}
        self.ready: dict[tuple[Path, str], dict] = {}
        self.outputs: dict[tuple[Path, str], dict] = {}

    def spec(self, workload: TvmWorkloadConfig, side_options: dict) -> dict:
        """What the worker compiles: the workload, with any side-specific options."""
        overrides = dict(side_options)
        options = {**workload.options, **overrides.pop("options", {})}
        return {
            "model": workload.model, "md5": workload.md5, "input_shape": workload.input_shape,
            "dtype": overrides.pop("dtype", workload.dtype), "options": options, "target": self.target,
            "device": self.device, "number": workload.number, "repeat": workload.samples, "seed": 0,
            "rpc": self.rpc,
        }

    def run(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
            side_options: dict) -> InvocationResult:
        """One timing batch; the first batch of a worker also carries compile time and outputs."""
        key = (artifact, workload.name)
        start = time.monotonic()
        metrics: dict = {}
        try:
            if key not in self.workers:
                threads = self.config.threads or os.cpu_count() or 1
                worker = Worker(artifact, self.spec(workload, side_options), {"TVM_NUM_THREADS": str(threads)})
                self.workers[key] = worker
                self.ready[key] = worker.receive(COMPILE_TIMEOUT_S)
                worker.send({"cmd": "outputs"})
                self.outputs[key] = worker.receive(timeout_s)
                metrics.update(compile_ms=self.ready[key]["compile_ms"], ready=self.ready[key],
                               outputs=self.outputs[key])
            worker = self.workers[key]
            worker.send({"cmd": "run"})
            reply = worker.receive(timeout_s)
        except WorkerError as exc:
            self.close(key)
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        metrics["ops"] = reply.get("ops", {})
        return InvocationResult("ok", tuple(reply["samples"]), time.monotonic() - start, "", (), metrics)

    def close(self, key=None) -> None:
        """Stop one worker, or all of them."""
        for k in [key] if key is not None else list(self.workers):
            worker = self.workers.pop(k, None)
            if worker is not None:
                try:
                    worker.send({"cmd": "exit"})
                    worker.proc.wait(5)
                except (WorkerError, subprocess.TimeoutExpired):
                    pass
                worker.kill()
