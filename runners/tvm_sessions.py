"""TVM workloads on a runner: one harness worker process per invocation.

A worker (``runners/worker/tvm_worker.py``) runs in the build's own Python. The first worker of
a (side, build, workload) compiles the workload and exports the library; every later
worker loads that library, so each build compiles once while every invocation is still a
fresh process (the statistics' unit: two processes of one build differ by several
percent, so one long-lived worker per side would turn that into false alarms). A worker
that fails to compile, crashes or exceeds its time is killed and reported as that
build's failure. Counted workers are forked from a per-build fork server that has imported
TVM (``ForkServers``, ``runners/fork_servers.py``); so are timed workers after the compiling
one, with ``[runner] processes = "forked"``, from a per-build, per-side server restarted every
few children (``TimedServers``). On this host's CPU, a timed worker after the compiling one runs
the library on TVM's runtime library alone, with the inputs the compiling worker saved
(``runners/worker/saved.py``). One worker process and its conversation: ``Worker``
(``runners/worker_process.py``).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

from abwatch.builders.procs import Placement
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import RunnerConfig
from abwatch.builders.workload_spec import TvmWorkloadConfig
from abwatch.runners.results import InvocationResult, OutputTensor, TvmMetrics, WorkerReady
from abwatch.runners import code_size, counters
from abwatch.runners.counters import CountError, InstructionCounter
from abwatch.runners.fork_servers import ForkServers, TimedServers, child_ended, from_child, prestarts
from abwatch.runners.worker_process import Worker, WorkerError

# A counted worker also runs one thread: the count is then one thread's work, not the pool's
# spinning and stealing.
COUNTED_ENV = {**counters.COUNTED_ENV, "TVM_NUM_THREADS": "1"}

COMPILE_TIMEOUT_S = 900.0

log = logging.getLogger(__name__)


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


def _cpu_samples(usage: dict, count: int) -> tuple[float, ...]:
    """Each sample's CPU time (ms) in a timing batch's ``usage``, checked: one finite,
    non-negative number per sample, or none at all."""
    values = usage.get("cpu_samples")
    if values is None:
        return ()
    if not (isinstance(values, list) and len(values) == count and all(
            isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values)):
        raise WorkerError("worker broke the protocol: cpu_samples is not one non-negative number a sample")
    return tuple(float(v) for v in values)


def _timed(reply: dict, metrics: TvmMetrics, series: dict[str, tuple[float, ...]], wall_s: float,
           threads: int) -> InvocationResult:
    """The result of a timed worker's ``run`` reply."""
    metrics["ops"] = reply.get("ops", {})
    metrics["op_features"] = reply.get("op_features", {})
    usage = reply.get("usage") or {}  # the timing batch's, on the host CPU (absent over RPC, on a GPU)
    return InvocationResult("ok", tuple(reply["samples"]), wall_s, "", (), metrics,
                            cpu_s=usage.get("cpu_s"), involuntary_switches=usage.get("involuntary_switches"),
                            usage_wall_s=usage.get("wall_s"), threads=threads, max_rss_kb=usage.get("max_rss_kb"),
                            series=series, cpu_samples=_cpu_samples(usage, len(reply["samples"])),
                            began=usage.get("began"), cpus=tuple(usage["cpus"]) if "cpus" in usage else None)


class TvmSessions:
    """Runs TVM invocations for one runner; keeps each build's compiled library."""

    def __init__(self, config: RunnerConfig, target: dict | str, device: str, rpc: dict | None = None,
                 nodes: tuple[str, ...] = ()) -> None:
        self.config, self.target, self.device, self.rpc, self.nodes = config, target, device, rpc, nodes
        # made at the first compile: a runner made only to name its device leaves nothing behind
        self._libs: tempfile.TemporaryDirectory | None = None
        self._dirs: dict[tuple[str, Path], Path] = {}  # each (side, build)'s, under self._libs
        self.compiled: set[tuple[str, Path, str]] = set()
        # the target string each build's workers resolved ("native" made this host's CPU)
        self.resolved: dict[Path, str] = {}
        # counted processes run in threads (run.counted_jobs): one of them compiles a side's library
        self._libs_lock, self._ensuring = threading.Lock(), threading.Lock()
        self.forks = ForkServers()
        self.timed = TimedServers(config.children_per_server, prestart=prestarts(config.servers_ahead))
        # the workloads a worker, fork server or child failed on TVM's runtime library alone,
        # and why: every build's later workers of them load the compiler too, so the two sides
        # of a pair never differ in what their processes loaded (their peak memory would)
        self.runtime_refused: dict[str, str] = {}

    def _lib_dir(self, side: str, artifact: Path) -> Path:
        """The (side, build)'s own directory of libraries and saved inputs, made at its first use.

        One directory per (side, build), under a root its workers may cross but not list
        (mode 0711) and with a name drawn at random: a worker may write its own directory
        only, and only while it compiles (:meth:`_sandbox`), so one side's code (a pull
        request's build) cannot replace or add to what the other side's workers load."""
        with self._libs_lock:
            if self._libs is None:
                self._libs = tempfile.TemporaryDirectory(prefix="abwatch-tvm-libs-")
                os.chmod(self._libs.name, 0o711)  # the sandbox's user enters it, to its own directory
            if (side, artifact) not in self._dirs:
                self._dirs[side, artifact] = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=self._libs.name))
            return self._dirs[side, artifact]

    def _sandbox(self, side: str, artifact: Path, compiles: bool = False) -> Sandbox:
        """Where a worker of ``side``'s ``artifact`` runs: a compiling worker writes its (side,
        build)'s directory of libraries, every other worker writes none; an RPC worker needs
        the network (the tracker and the board), a GPU one its device nodes."""
        return Sandbox(writable=(self._lib_dir(side, artifact),) if compiles else (),
                       network=True if self.rpc else None, devices=self.nodes)

    def spec(self, workload: TvmWorkloadConfig, side_options: dict) -> dict:
        """What the worker compiles: the workload, with any side-specific options."""
        overrides = dict(side_options)
        options = {**workload.options, **overrides.pop("options", {})}
        return {
            "model": workload.model, "md5": workload.md5, "script_sha256": workload.script_sha256,
            "input_shape": overrides.pop("input_shape", workload.input_shape),
            "dtype": overrides.pop("dtype", workload.dtype), "options": options, "target": self.target,
            "device": self.device, "number": workload.number, "repeat": workload.samples, "seed": 0,
            "rpc": self.rpc,
        }

    def threads(self, workload: TvmWorkloadConfig, placement: Placement | None = None) -> int:
        """The threads ``workload``'s processes run on (``RunnerConfig.measured_threads``): one
        by default on this host's CPU, every core for a GPU's or a board's host-side worker; a
        duet's side (``placement``) as many as its CPUs (more there would wait for each other)."""
        if placement is not None:
            return len(placement.cpus)
        return self.config.measured_threads(workload.threads, self.device == "cpu" and not self.rpc)

    def forks_timed(self) -> bool:
        """Whether timed workers after the compiling one are forked (``[runner] processes``):
        on this host's CPU only. A GPU's driver and an RPC session are a fresh process's."""
        return self.config.processes == "forked" and self.on_host()

    def run(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
            side: str, side_options: dict, placement: Placement | None = None) -> InvocationResult:
        """One invocation: a fresh worker that loads (or first compiles) the library, answers one
        timing batch, and exits. The compiling invocation also reports compile time and outputs.
        With ``processes = "forked"`` every later one is a child of the side's fork server
        (:meth:`forked`). With ``placement`` (a duet's side) the worker runs pinned, on as many
        threads as it has CPUs, and starts its timing batch when the other side's worker does:
        a fresh one pinned before its first instruction, a forked child as soon as it reads its
        spec.

        On this host's CPU the compiling worker saves the workload's inputs beside the library,
        and a later worker (a duet's excepted) loads them on TVM's runtime library alone
        (``TVM_USE_RUNTIME_LIB=1``: half an ``import tvm``); one that fails so is run again with
        the compiler, which serves the workload from then on (:attr:`runtime_refused`)."""
        # Per side even when both sides are the same build (an A/A run).
        key = (side, artifact, workload.name)
        lib = self._lib(artifact, workload, side)
        first = key not in self.compiled
        if not first and self.forks_timed():
            return self.forked(artifact, workload, timeout_s, side, side_options, placement)
        threads = self.threads(workload, placement)
        spec, env, saved = self._fresh(artifact, workload, side, side_options, first, threads, placement)
        start = time.monotonic()
        metrics = TvmMetrics()
        worker = None
        try:
            worker = Worker(artifact, spec, env, self._sandbox(side, artifact, compiles=first),
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
            if saved is not None and "timeout" not in str(exc):  # a hung worker is the workload's, on any library
                self._refuse(workload, "a fresh worker failed", exc)
                if worker is not None:
                    worker.close()
                return self.run(artifact, workload, timeout_s, side, side_options)
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        finally:
            if worker is not None:
                worker.close()
        return _timed(reply, metrics, series, time.monotonic() - start, threads)

    def _fresh(self, artifact: Path, workload: TvmWorkloadConfig, side: str, side_options: dict, first: bool,
               threads: int, placement: Placement | None) -> tuple[dict, dict[str, str], Path | None]:
        """A fresh worker's spec and environment, and the saved inputs it loads on TVM's runtime
        library alone (None: it builds its model, or compiles it, with the compiler loaded)."""
        lib = self._lib(artifact, workload, side)
        spec = dict(self.spec(workload, side_options), **({"export": str(lib)} if first else {"load": str(lib)}))
        env = {"TVM_NUM_THREADS": str(threads)}
        if first and self.on_host():  # later workers load the inputs rather than build them
            spec["save"] = str(self._saved(artifact, workload, side))
        # a duet's worker waits for the other side's: it is never run a second time
        saved = self._on_runtime(spec, env, artifact, workload, side) if not first and placement is None else None
        return spec, env, saved

    def forked(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
               side: str, side_options: dict, placement: Placement | None = None) -> InvocationResult:
        """One invocation as a child of the (side, build)'s fork server: it loads the library
        the compiling worker exported, answers one timing batch and exits, as a fresh worker
        would; its result names its server (``server``). A child that fails takes its server
        down with it (the next child gets a new one). With ``placement`` (a duet's side) the
        child pins itself to its CPUs before it loads anything, runs as many threads as it has
        CPUs (the server's environment says so: a server per thread count) and starts its
        timing batch when the other side's does.

        Where the compiling worker saved the workload's inputs (``runners/worker/saved.py``),
        the server imports TVM's runtime library alone (``TVM_USE_RUNTIME_LIB=1``: about half
        the start of one with the compiler) and its children load them. Where that server fails
        to start or its child fails (a library may call a function only the compiler's library
        registers), the invocation is run again by a server with the compiler, which serves the
        workload from then on (:attr:`runtime_refused`): only that one's failure is the build's."""
        spec = dict(self.spec(workload, side_options), load=str(self._lib(artifact, workload, side)))
        if placement is not None:  # the child pins itself from its spec: its server serves both CPUs
            spec["cpus"] = sorted(placement.cpus)
        env = {"TVM_NUM_THREADS": str(threads := self.threads(workload, placement))}
        saved = self._on_runtime(spec, env, artifact, workload, side)
        start = time.monotonic()
        server = None
        try:
            with self.timed.one(side, artifact, env, self._sandbox(side, artifact),
                                max(COMPILE_TIMEOUT_S, timeout_s), workload.children_per_server) as server:
                server.worker.send({"cmd": "fork"})
                child = from_child(server.worker, timeout_s, "forked")
                server.worker.send(spec)
                from_child(server.worker, timeout_s, "forked")  # loaded: the limits are a fresh worker's
                if placement is not None and placement.together is not None:
                    placement.together()  # both sides' timing batches begin at once
                server.worker.send({"cmd": "run"})
                reply = from_child(server.worker, timeout_s, "forked")
                series = _series(reply)
                server.worker.send({"cmd": "exit"})  # to the child; its server says when it is gone
                ended = server.worker.receive(timeout_s)
                if ended.get("status") != 0:
                    raise WorkerError(child_ended(ended, server.worker, "forked"))
                wall_s = time.monotonic() - start  # a server closed after its last child is not this child's
        except WorkerError as exc:
            if saved is not None and "timeout" not in str(exc):  # a hung child is the workload's, on any library
                self._refuse(workload, "a fork server failed to start" if server is None else "a child failed", exc)
                self.timed.discard(side, artifact, env)  # its successor, started ahead, serves no one
                return self.forked(artifact, workload, timeout_s, side, side_options, placement)
            status = "timeout" if "timeout" in str(exc) else "error"
            return InvocationResult(status, (), time.monotonic() - start, str(exc))
        return replace(_timed(reply, TvmMetrics(), series, wall_s, threads), server=server.index,
                       pid=child.get("child"), server_start_s=server.start_s if server.children == 1 else None)

    def compile_time(self, artifact: Path, workload: TvmWorkloadConfig, timeout_s: float,
                     side: str, side_options: dict) -> InvocationResult:
        """A fresh worker that compiles the workload (on this host, never uploaded), reports
        its compile time as the one sample, and exits: the compiler's speed, not a cache's."""
        # compiled here for the runner's target (a board's too); no device is touched
        spec = dict(self.spec(workload, side_options), rpc=None, compile_only=True)
        threads = self.threads(workload)
        start = time.monotonic()
        worker = None
        try:
            worker = Worker(artifact, spec, {"TVM_NUM_THREADS": str(threads)}, self._sandbox(side, artifact))
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
                from_child(server.worker, wait_s)  # forked: the spec goes to the child
                server.worker.send(spec)
                ready = from_child(server.worker, wait_s)
                if what == "run":
                    server.worker.send({"cmd": "count_run"})
                    ready = from_child(server.worker, wait_s)
                server.worker.send({"cmd": "exit"})  # to the child; its server says when it is gone
                ended = server.worker.receive(120.0)  # the counts are written as it exits (slowly under Valgrind)
                if ended.get("status") != 0:
                    raise WorkerError(child_ended(ended, server.worker))
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
        return self._lib_dir(side, artifact) / f"{workload.name}.so"

    def _saved(self, artifact: Path, workload: TvmWorkloadConfig, side: str) -> Path:
        """Where the compiling worker saves the inputs its library's later workers load."""
        return self._lib(artifact, workload, side).with_suffix(".inputs.npz")

    def on_host(self) -> bool:
        """Whether workers run the workload on this host's CPU (not a GPU's, not a board's)."""
        return self.device == "cpu" and not self.rpc

    def _on_runtime(self, spec: dict, env: dict[str, str], artifact: Path, workload: TvmWorkloadConfig,
                    side: str) -> Path | None:
        """Point a later worker's ``spec`` and ``env`` at TVM's runtime library alone and the
        inputs the compiling worker saved, where it may use them: on this host's CPU, for a
        workload that has not failed so (:attr:`runtime_refused`); those inputs, or None (the
        worker then loads the compiler and builds its inputs)."""
        saved = self._saved(artifact, workload, side)
        if not self.on_host() or workload.name in self.runtime_refused or not saved.exists():
            return None
        spec["saved"], env["TVM_USE_RUNTIME_LIB"] = str(saved), "1"
        return saved

    def _refuse(self, workload: TvmWorkloadConfig, what: str, exc: WorkerError) -> None:
        """Serve ``workload`` with the compiler loaded from now on, on both sides: ``what``
        failed on TVM's runtime library alone."""
        self.runtime_refused[workload.name] = str(exc)
        log.warning("%s: %s on TVM's runtime library alone (%s); its later workers load the compiler too",
                    workload.name, what, exc)

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
            self._dirs.clear()
        self.compiled.clear()
        self.runtime_refused.clear()
