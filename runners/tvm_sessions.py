"""TVM workloads on a runner: one harness worker process per invocation.

A worker (``runners/worker/tvm_worker.py``) runs in the build's own Python. The first worker of
a (side, build, workload) compiles the workload and exports the library; every later
worker loads that library, so each build compiles once while every invocation is still a
fresh process (the statistics' unit: two processes of one build differ by several
percent, so one long-lived worker per side would turn that into false alarms). A worker
that fails to compile, crashes or exceeds its time is killed and reported as that
build's failure. Counted workers are forked from a per-build fork server that has imported
TVM (below, ``ForkServers``); so are timed workers after the compiling one, with ``[runner]
processes = "forked"``, from a per-build, per-side server restarted every few children
(``TimedServers``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

from abwatch.core.redact import mask_secrets
from abwatch.builders.environment import ArtifactInfoError, build_environment, build_python
from abwatch.builders.procs import Placement, child_env, kill_tree, pinned
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import ARTIFACT_INFO, RunnerConfig
from abwatch.builders.workload_spec import TvmWorkloadConfig
from abwatch.runners.results import InvocationResult, OutputTensor, TvmMetrics, WorkerReady
from abwatch.runners import code_size, counters
from abwatch.runners.counters import CountError, InstructionCounter

# A counted worker also runs one thread: the count is then one thread's work, not the pool's
# spinning and stealing.
COUNTED_ENV = {**counters.COUNTED_ENV, "TVM_NUM_THREADS": "1"}

# The worker's side (runners/worker/): files the build's Python runs, never imported here.
WORKER_DIR = Path(__file__).with_name("worker")
WORKER = WORKER_DIR / "tvm_worker.py"
COMPILE_TIMEOUT_S = 900.0
MAX_LINE = 64 * 2**20  # the longest reply line a worker may send (per-operator tables, output tensors)


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
            # not killed with the thread that started it: a fork server serves later threads
            argv = sandbox.wrap(argv, None, self._tmp.name, die_with_parent=False)
        try:
            with pinned(cpus):  # a duet's side: on its CPUs from the start (procs.pinned)
                self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        threading.Thread(target=self._drain, daemon=True).start()
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
            raise WorkerError(f"worker {self._ending()}: {self.tail()}")
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

    def tail(self) -> str:
        """The last lines the worker wrote to stderr."""
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


# Fork servers for counted workers: ``import tvm`` once per build, not once per count.
#
# Under Valgrind a counted worker spent about half its time in ``import tvm`` (~25 s of 40-55 s
# on a 2-core machine), which the count leaves out anyway. So a counted worker is a child
# forked from a fork server: a worker of the build (tvm_worker.py given {"fork": true}) that has
# imported TVM under the counter and nothing else. Each child builds and compiles its workload
# from scratch, as a fresh process would, and exits; the server never compiles, so no child
# inherits a compiled module or a warm cache. Idle servers (a few hundred MB each under
# Valgrind) are kept between counts, at most ``keep``, the least recently used closed first.


class ForkServer:
    """One fork server under ``counter`` and the scratch directory its counts are written to."""

    def __init__(self, artifact: Path, env: dict[str, str], counter: InstructionCounter, timeout_s: float) -> None:
        self.key = (artifact, counter.name)
        self._scratch = tempfile.TemporaryDirectory(prefix="abwatch-count-")
        self.scratch = Path(self._scratch.name)
        try:
            # counted workers write only their counts; they never talk to a board (counted on this CPU)
            self.worker = Worker(artifact, {"fork": True}, env, Sandbox(writable=(self.scratch,)),
                                 lambda argv: counter.region_argv(argv, self.scratch))
            self.worker.receive(timeout_s)
        except WorkerError:
            self._scratch.cleanup()
            raise

    def forget_counts(self) -> None:
        """Remove what the last child left in the scratch directory, whatever the counter wrote
        (the server's own files are written through descriptors it holds, or at its exit)."""
        for path in self.scratch.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()

    def close(self) -> None:
        """Stop the server (and any child) and remove its scratch directory."""
        self.worker.close()
        self._scratch.cleanup()


class ForkServers:
    """The idle fork servers of one runner, by build and counter."""

    # a run's counts use a few at once: at most the first look's 6 processes, of two builds
    KEEP = 8

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._idle: list[ForkServer] = []  # least recently used first
        self._lock = threading.Lock()

    @property
    def idle(self) -> list[ForkServer]:
        """The idle servers, least recently used first."""
        with self._lock:
            return list(self._idle)

    @contextlib.contextmanager
    def one(self, artifact: Path, env: dict[str, str], counter: InstructionCounter,
            timeout_s: float) -> Iterator[ForkServer]:
        """An idle server of ``artifact`` under ``counter`` (started if none is idle), for one
        count at a time. It goes back to the idle ones if the count went well; it is closed if
        anything failed (its child may have hung or broken the conversation)."""
        with self._lock:
            found = next((s for s in reversed(self._idle) if s.key == (artifact, counter.name)), None)
            if found is not None:
                self._idle.remove(found)
        server = found or ForkServer(artifact, env, counter, timeout_s)
        try:
            yield server
        except BaseException:
            server.close()
            raise
        server.forget_counts()
        with self._lock:
            self._idle.append(server)
            evicted, self._idle = self._idle[:-self.keep], self._idle[-self.keep:]
        for old in evicted:
            old.close()

    def close(self) -> None:
        """Close every idle server."""
        with self._lock:
            idle, self._idle = self._idle, []
        for server in idle:
            server.close()


# Fork servers for timed workers: a fork, not an interpreter's start and ``import tvm``.
#
# A fresh timed worker of builtin:mlp spent ~0.55 s of its ~0.9 s starting Python and importing
# TVM, and ~0.17 s loading, warming up and timing (benchmarks/tvm_worker_phases.py). A forked
# child skips the first part and is still a process of its own: its own library load, inputs,
# VM, warm-up and samples, and its own exit. What children of one server share is the server's
# memory layout, which can move a workload's time by a few percent. So a server serves at most
# ``children_per_server`` children before it is closed and a new one started (its environment
# padded by a random 0-4 KiB, which moves where its stack starts), each child moves its own
# stack and heap by a random amount (tvm_worker.py, ``_shifted``), and every invocation says
# which server it came from (``InvocationResult.server``), so the statistics can take servers
# as a level above processes. Each side has its own servers: the two builds' children never
# share one, and an A/A run's two sides are served by different servers too.

LAYOUT_PAD_BYTES = 4096  # environment padding drawn per server: one page of stack positions


class TimedServer:
    """One fork server of timed workers of one (side, build): its number in the runner's
    sequence of servers and how many children it has served."""

    def __init__(self, artifact: Path, env: dict[str, str], sandbox: Sandbox, index: int, timeout_s: float) -> None:
        pad = "x" * random.SystemRandom().randrange(LAYOUT_PAD_BYTES)
        self.index, self.children = index, 0
        self.worker = Worker(artifact, {"fork": True, "timed": True}, {**env, "ABWATCH_LAYOUT_PAD": pad}, sandbox)
        try:
            self.worker.receive(timeout_s)
        except WorkerError:
            self.worker.close()
            raise

    @property
    def pid(self) -> int:
        """The server process's id (the sandbox's, when sandboxed: its children are below it)."""
        return self.worker.proc.pid

    def close(self) -> None:
        """Stop the server and any child it has."""
        self.worker.close()


class TimedServers:
    """The timed fork servers of one runner: one live server per (side, build), replaced after
    ``children_per_server`` children, or at once when a child failed; at most ``KEEP`` live,
    the least recently used closed first."""

    KEEP = 4  # a run's two sides, and the next run's while a worker moves on

    def __init__(self, children_per_server: int) -> None:
        self.children_per_server = children_per_server
        self.started = 0  # servers started so far: the next one's index
        self._live: dict[tuple[str, Path], TimedServer] = {}
        self._lock = threading.Lock()

    @property
    def live(self) -> dict[tuple[str, Path], TimedServer]:
        """The live servers by (side, build)."""
        with self._lock:
            return dict(self._live)

    @contextlib.contextmanager
    def one(self, side: str, artifact: Path, env: dict[str, str], sandbox: Sandbox,
            timeout_s: float) -> Iterator[TimedServer]:
        """The (side, build)'s server for one child (started if there is none), held for the
        child's whole life; closed after it if the child failed or it has served its share."""
        key = (side, artifact)
        with self._lock:
            server = self._live.pop(key, None)  # taken: no other thread forks from it meanwhile
            if server is None:
                index, self.started = self.started, self.started + 1
        if server is None:
            server = TimedServer(artifact, env, sandbox, index, timeout_s)
        try:
            server.children += 1
            yield server
        except BaseException:
            server.close()
            raise
        if server.children >= self.children_per_server:
            server.close()
            return
        with self._lock:
            stale = [self._live.pop(key)] if key in self._live else []  # another thread's meanwhile
            self._live[key] = server  # the most recently used last
            while len(self._live) > self.KEEP:  # a watch's worker keeps its runner for many runs' builds
                stale.append(self._live.pop(next(iter(self._live))))
        for old in stale:
            old.close()

    def close(self) -> None:
        """Close every live server."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
        for server in live:
            server.close()


def _from_child(server: Worker, timeout_s: float, what: str = "counted") -> dict:
    """A forked child's reply; WorkerError if the child died first (its server then says so,
    naming it a ``what`` worker)."""
    reply = server.receive(timeout_s)
    if "forked" in reply:
        raise WorkerError(_ended(reply, server, what))
    return reply


def _ended(reply: dict, server: Worker, what: str = "counted") -> str:
    status = reply.get("status")
    # Valgrind 3.19 decodes no AVX-512: code compiled for such a host's CPU stops it with SIGILL
    hint = (" (SIGILL: an instruction the counter cannot run, such as AVX-512 under Valgrind)"
            if status == -4 and what == "counted" else "")
    tail = server.tail()
    return f"{what} worker ended with status {status}{hint}" + (f": {tail}" if tail else "")


def _series(reply: dict) -> dict[str, tuple[float, ...]]:
    """Each token generation's figures in a timing batch's reply (``series``: a workload that
    generates tokens), checked: one finite, positive number per sample of each."""
    out = {}
    for name, values in (reply.get("series") or {}).items():
        if not (isinstance(values, list) and len(values) == len(reply.get("samples", ())) and all(
                isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)):
            raise WorkerError(f"worker broke the protocol: series {name!r} is not one positive number a sample")
        out[str(name)] = tuple(float(v) for v in values)
    return out


def _timed(reply: dict, metrics: TvmMetrics, series: dict[str, tuple[float, ...]], wall_s: float,
           threads: int) -> InvocationResult:
    """The result of a timed worker's ``run`` reply."""
    metrics["ops"] = reply.get("ops", {})
    metrics["op_features"] = reply.get("op_features", {})
    usage = reply.get("usage") or {}  # the timing batch's, on the host CPU (absent over RPC, on a GPU)
    return InvocationResult("ok", tuple(reply["samples"]), wall_s, "", (), metrics,
                            cpu_s=usage.get("cpu_s"), involuntary_switches=usage.get("involuntary_switches"),
                            usage_wall_s=usage.get("wall_s"), threads=threads, max_rss_kb=usage.get("max_rss_kb"),
                            series=series)


class TvmSessions:
    """Runs TVM invocations for one runner; keeps each build's compiled library."""

    def __init__(self, config: RunnerConfig, target: dict | str, device: str, rpc: dict | None = None,
                 nodes: tuple[str, ...] = ()) -> None:
        self.config, self.target, self.device, self.rpc, self.nodes = config, target, device, rpc, nodes
        # made at the first compile: a runner made only to name its device leaves nothing behind
        self._libs: tempfile.TemporaryDirectory | None = None
        self.compiled: set[tuple[str, Path, str]] = set()
        # the target string each build's workers resolved ("native" made this host's CPU)
        self.resolved: dict[Path, str] = {}
        # counted processes run in threads (run.counted_jobs): one of them compiles a side's library
        self._libs_lock, self._ensuring = threading.Lock(), threading.Lock()
        self.forks = ForkServers()
        self.timed = TimedServers(config.children_per_server)

    def _lib_dir(self) -> Path:
        with self._libs_lock:
            if self._libs is None:
                self._libs = tempfile.TemporaryDirectory(prefix="abwatch-tvm-libs-")
            return Path(self._libs.name)

    def _sandbox(self) -> Sandbox:
        """Where a worker runs: it writes the compiled libraries; an RPC worker needs the network
        (the tracker and the board), a GPU one its device nodes."""
        return Sandbox(writable=(self._lib_dir(),), network=True if self.rpc else None, devices=self.nodes)

    def spec(self, workload: TvmWorkloadConfig, side_options: dict) -> dict:
        """What the worker compiles: the workload, with any side-specific options."""
        overrides = dict(side_options)
        options = {**workload.options, **overrides.pop("options", {})}
        return {
            "model": workload.model, "md5": workload.md5, "script_sha256": workload.script_sha256, "input_shape": workload.input_shape,
            "dtype": overrides.pop("dtype", workload.dtype), "options": options, "target": self.target,
            "device": self.device, "number": workload.number, "repeat": workload.samples, "seed": 0,
            "rpc": self.rpc,
        }

    def forks_timed(self) -> bool:
        """Whether timed workers after the compiling one are forked (``[runner] processes``):
        on this host's CPU only. A GPU's driver and an RPC session are a fresh process's."""
        return self.config.processes == "forked" and self.device == "cpu" and not self.rpc

    def run(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
            side: str, side_options: dict, placement: Placement | None = None) -> InvocationResult:
        """One invocation: a fresh worker that loads (or first compiles) the library, answers one
        timing batch, and exits. The compiling invocation also reports compile time and outputs.
        With ``processes = "forked"`` every later one is a child of the side's fork server
        (:meth:`forked`). With ``placement`` (a duet's side) the worker runs pinned, on as many
        threads as it has CPUs, and starts its timing batch when the other side's worker does;
        a duet's workers start fresh, pinned before their first instruction."""
        # Per side even when both sides are the same build (an A/A run).
        key = (side, artifact, workload.name)
        lib = self._lib(artifact, workload, side)
        first = key not in self.compiled
        if not first and self.forks_timed() and placement is None:
            return self.forked(artifact, workload, timeout_s, side, side_options)
        spec = dict(self.spec(workload, side_options), **({"export": str(lib)} if first else {"load": str(lib)}))
        threads = self.config.threads or os.cpu_count() or 1
        if placement is not None:  # more threads than its CPUs would wait for each other there
            threads = len(placement.cpus)
        start = time.monotonic()
        metrics = TvmMetrics()
        worker = None
        try:
            worker = Worker(artifact, spec, {"TVM_NUM_THREADS": str(threads)}, self._sandbox(),
                            cpus=placement.cpus if placement is not None else None)
            ready = worker.receive(max(COMPILE_TIMEOUT_S, timeout_s) if first else timeout_s)
            self._resolved(artifact, ready)
            if first:
                worker.send({"cmd": "outputs"})
                metrics["compile_ms"], metrics["ready"] = ready["compile_ms"], cast(WorkerReady, ready)
                metrics["outputs"] = cast(OutputTensor, worker.receive(timeout_s))
                size = code_size.measure(lib)  # exported by this worker before it said it was ready
                if size is not None:
                    metrics["code"] = {"text_bytes": size["text_bytes"], "file_bytes": size["file_bytes"]}
                self.compiled.add(key)
            if placement is not None and placement.together is not None:
                placement.together()  # both sides' timing batches begin at once
            worker.send({"cmd": "run"})
            reply = worker.receive(timeout_s)
            series = _series(reply)
        except WorkerError as exc:
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        finally:
            if worker is not None:
                worker.close()
        return _timed(reply, metrics, series, time.monotonic() - start, threads)

    def forked(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
               side: str, side_options: dict) -> InvocationResult:
        """One invocation as a child of the (side, build)'s fork server: it loads the library
        the compiling worker exported, answers one timing batch and exits, as a fresh worker
        would; its result names its server (``server``). A child that fails takes its server
        down with it (the next child gets a new one)."""
        spec = dict(self.spec(workload, side_options), load=str(self._lib(artifact, workload, side)))
        threads = self.config.threads or os.cpu_count() or 1
        start = time.monotonic()
        try:
            with self.timed.one(side, artifact, {"TVM_NUM_THREADS": str(threads)}, self._sandbox(),
                                max(COMPILE_TIMEOUT_S, timeout_s)) as server:
                server.worker.send({"cmd": "fork"})
                child = _from_child(server.worker, timeout_s, "forked")
                server.worker.send(spec)
                _from_child(server.worker, timeout_s, "forked")  # loaded: the limits are a fresh worker's
                server.worker.send({"cmd": "run"})
                reply = _from_child(server.worker, timeout_s, "forked")
                series = _series(reply)
                server.worker.send({"cmd": "exit"})  # to the child; its server says when it is gone
                ended = server.worker.receive(timeout_s)
                if ended.get("status") != 0:
                    raise WorkerError(_ended(ended, server.worker, "forked"))
                wall_s = time.monotonic() - start  # a server closed after its last child is not this child's
        except WorkerError as exc:
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        return replace(_timed(reply, TvmMetrics(), series, wall_s, threads), server=server.index,
                       pid=child.get("child"))

    def compile_time(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
                     side: str, side_options: dict) -> InvocationResult:
        """A fresh worker that compiles the workload (on this host, never uploaded), reports
        its compile time as the one sample, and exits: the compiler's speed, not a cache's."""
        # compiled here for the runner's target (a board's too); no device is touched
        spec = dict(self.spec(workload, side_options), rpc=None, compile_only=True)
        threads = self.config.threads or os.cpu_count() or 1
        start = time.monotonic()
        worker = None
        try:
            worker = Worker(artifact, spec, {"TVM_NUM_THREADS": str(threads)}, self._sandbox())
            ready = worker.receive(max(COMPILE_TIMEOUT_S, timeout_s))
        except WorkerError as exc:
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        finally:
            if worker is not None:
                worker.close()
        self._resolved(artifact, ready)
        return InvocationResult("ok", (float(ready["compile_ms"]),), time.monotonic() - start,
                                max_rss_kb=ready.get("max_rss_kb"))

    def _resolved(self, artifact: Path, ready: dict) -> None:
        if isinstance(ready.get("target"), str):
            self.resolved[artifact] = ready["target"]

    def counted(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float, side: str,
                side_options: dict, counter: InstructionCounter, what: str) -> InvocationResult:
        """A fresh worker under ``counter`` (forked from the build's fork server) that counts the
        instructions of ``what``: "compile" (the compile call, compiled here for the runner's
        target) or "run" (``number`` calls of the compiled workload, on this host's CPU only);
        its one sample is that count (per call for "run")."""
        if what == "run" and (self.rpc or self.device != "cpu"):
            return InvocationResult("error", (), 0.0, f"instructions are counted on this host's CPU only; "
                                    f"a run on {'an RPC board' if self.rpc else self.device} keeps wall time")
        spec = dict(self.spec(workload, side_options), rpc=None, count=counter.name)
        if what == "compile":
            spec["compile_only"] = True
        else:  # loads the library this build compiled for the timed runs (compiling it first if needed)
            failed = self._ensure_compiled(artifact, workload, timeout_s, side, side_options)
            if failed is not None:
                return failed
            spec["load"] = str(self._lib(artifact, workload, side))
        if isinstance(self.target, dict) and self.target.get("mcpu") == "native":
            failed = self._name_native(artifact, workload, timeout_s, side, side_options)
            if failed is not None:
                return failed
            spec["target"] = self.resolved[artifact]  # this host's CPU, as a worker outside the counter saw it
        start = time.monotonic()
        wait_s = max(COMPILE_TIMEOUT_S, timeout_s)
        try:
            with self.forks.one(artifact, COUNTED_ENV, counter, wait_s) as server:
                server.worker.send({"cmd": "fork"})
                _from_child(server.worker, wait_s)  # forked: the spec goes to the child
                server.worker.send(spec)
                ready = _from_child(server.worker, wait_s)
                if what == "run":
                    server.worker.send({"cmd": "count_run"})
                    ready = _from_child(server.worker, wait_s)
                server.worker.send({"cmd": "exit"})  # to the child; its server says when it is gone
                ended = server.worker.receive(120.0)  # the counts are written as it exits (slowly under Valgrind)
                if ended.get("status") != 0:
                    raise WorkerError(_ended(ended, server.worker))
                count = counter.read_region(server.scratch, ready.get("instructions") or {})
                # read before the scratch directory is cleaned for the server's next child
                profile = counter.region_profile(server.scratch, ready.get("instructions") or {})
        except WorkerError as exc:
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        except CountError as exc:
            return InvocationResult("error", (), time.monotonic() - start, f"{counter.name}: {exc}")
        calls = ready["calls"] if what == "run" else 1
        return InvocationResult("ok", (float(count / calls),), time.monotonic() - start,
                                profile=profile.per(calls).to_dict() if profile else None)

    def _name_native(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float, side: str,
                     side_options: dict) -> InvocationResult | None:
        """Make sure an uncounted worker of ``artifact`` has named this host's CPU (under Valgrind
        ``mcpu=native`` is Valgrind's own CPU model): one compile outside the counter when no
        worker of this build ran yet; its failure, if it fails."""
        with self._ensuring:
            if artifact in self.resolved:
                return None
            named = self.compile_time(artifact, workload, timeout_s, side, side_options)
        return None if named.status == "ok" else named

    def _lib(self, artifact: Path, workload: TvmWorkloadConfig, side: str) -> Path:
        return self._lib_dir() / f"{side}-{artifact.name}-{workload.name}.so"

    def _ensure_compiled(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float, side: str,
                         side_options: dict) -> InvocationResult | None:
        """Compile and export the side's library unless a timed run did; the failure if it fails."""
        with self._ensuring:
            if (side, artifact, workload.name) in self.compiled:
                return None
            result = self.run(artifact, workload, timeout_s, side, side_options)
            return None if result.status == "ok" else result

    def close(self) -> None:
        """Stop the fork servers; remove the compiled libraries."""
        self.forks.close()
        self.timed.close()
        if self._libs is not None:
            self._libs.cleanup()
            self._libs = None
        self.compiled.clear()
