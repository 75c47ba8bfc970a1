"""Fork servers: workers of a build (``tvm_worker.py`` given ``{"fork": true}``) that have
imported TVM once and fork a fresh worker per invocation.

Counted workers are children of a per-build server under the counter (:class:`ForkServers`);
with ``[runner] processes = "forked"``, so are timed workers after the compiling one, from a
per-build, per-side server restarted every few children (:class:`TimedServers`). The runner's
TVM sessions (``runners/tvm_sessions.py``) hold one of each and talk to the children through
their servers (:func:`from_child`).
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from abwatch.builders.sandbox import Sandbox
from abwatch.runners.counters import InstructionCounter
from abwatch.runners.worker_process import Worker, WorkerError


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
# which server it came from (``InvocationResult.server``), and the statistics take servers
# as a level above processes. Each side has its own servers: the two builds' children never
# share one, and an A/A run's two sides are served by different servers too.

LAYOUT_PAD_BYTES = 4096  # environment padding drawn per server: one page of stack positions


class TimedServer:
    """One fork server of timed workers of one (side, build): its number in the runner's
    sequence of servers, how many children it has served, when it was started (``began``,
    monotonic), how long it took (``start_s``: its interpreter and ``import tvm``) and the TVM
    libraries it mapped (``libraries``: ``libtvm_runtime.so`` alone where its environment has
    ``TVM_USE_RUNTIME_LIB=1``)."""

    def __init__(self, artifact: Path, env: dict[str, str], sandbox: Sandbox, index: int, timeout_s: float) -> None:
        pad = "x" * random.SystemRandom().randrange(LAYOUT_PAD_BYTES)
        self.index, self.children = index, 0
        self.began = time.monotonic()
        self.worker = Worker(artifact, {"fork": True, "timed": True}, {**env, "ABWATCH_LAYOUT_PAD": pad}, sandbox)
        try:
            ready = self.worker.receive(timeout_s)
        except WorkerError:
            self.worker.close()
            raise
        self.start_s = time.monotonic() - self.began
        # which of TVM's libraries it loaded: the runtime's alone, or the compiler's too
        self.libraries = tuple(str(name) for name in ready.get("libraries", ()))

    @property
    def pid(self) -> int:
        """The server process's id (the sandbox's, when sandboxed: its children are below it)."""
        return self.worker.proc.pid

    def close(self) -> None:
        """Stop the server and any child it has."""
        self.worker.close()


def prestarts(wanted: bool = True) -> bool:
    """Whether timed servers start their successors ahead (:class:`TimedServers`): where
    ``wanted`` (``[runner] servers_ahead``) and this process may run on two CPUs or more, so a
    successor's ``import tvm`` has a CPU beside the measured child's. On one CPU it would take
    the child's."""
    return wanted and len(os.sched_getaffinity(0)) >= 2


# A server's start (~0.7 s quiet: an interpreter and ``import tvm``) cost more than the eight
# children it served (~0.05 s each for a small workload taking 5 samples): two thirds of a
# forked run's time went to waiting for servers. So when a server takes its first child, its
# successor starts in the background and is ready when the server has served its share; a
# pair then waits only for what is left of a start its predecessor's children did not cover.


class TimedServers:
    """The timed fork servers of one runner: one live server per (side, build, environment:
    a workload's own ``TVM_NUM_THREADS``, which its children inherit), replaced after
    ``children_per_server`` children, or at once when a child failed; at most ``KEEP`` live,
    the least recently used closed first. With ``prestart`` (default: :func:`prestarts`), a
    server's successor is started when the server takes its first child."""

    KEEP = 4  # a run's two sides, and the next run's while a worker moves on

    def __init__(self, children_per_server: int, prestart: bool | None = None) -> None:
        self.children_per_server = children_per_server
        self.prestart = prestarts() if prestart is None else prestart
        self.started = 0  # servers started so far: the next one's index
        self._live: dict[tuple[str, Path, tuple], TimedServer] = {}
        self._next: dict[tuple[str, Path, tuple], Future[TimedServer]] = {}  # successors starting or ready
        self._starting: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def live(self) -> dict[tuple[str, Path, tuple], TimedServer]:
        """The live servers by (side, build, environment)."""
        with self._lock:
            return dict(self._live)

    @property
    def successors(self) -> dict[tuple[str, Path, tuple], Future[TimedServer]]:
        """The successors started ahead, by (side, build, environment)."""
        with self._lock:
            return dict(self._next)

    def _start(self, artifact: Path, env: dict[str, str], sandbox: Sandbox, timeout_s: float) -> TimedServer:
        with self._lock:
            index, self.started = self.started, self.started + 1
        return TimedServer(artifact, env, sandbox, index, timeout_s)

    @contextlib.contextmanager
    def one(self, side: str, artifact: Path, env: dict[str, str], sandbox: Sandbox,
            timeout_s: float, children: int | None = None) -> Iterator[TimedServer]:
        """The (side, build)'s server for one child (its successor started ahead, or a new
        one, if there is none live), held for the child's whole life; closed after it if the
        child failed or it has served its share (``children``, the workload's; default
        ``children_per_server``)."""
        # the environment is the server's from its start: a workload on other threads needs its own
        key = (side, artifact, tuple(sorted(env.items())))
        with self._lock:
            server = self._live.pop(key, None)  # taken: no other thread forks from it meanwhile
            successor = self._next.pop(key, None) if server is None else None
        if server is None:
            # a successor that failed to start raises here, as a server started now would
            server = successor.result() if successor is not None else self._start(artifact, env, sandbox, timeout_s)
        if server.children == 0 and self.prestart:
            self._start_ahead(key, artifact, env, sandbox, timeout_s)
        try:
            server.children += 1
            yield server
        except BaseException:
            server.close()
            raise
        if server.children >= (children or self.children_per_server):
            server.close()
            return
        with self._lock:
            stale = [self._live.pop(key)] if key in self._live else []  # another thread's meanwhile
            self._live[key] = server  # the most recently used last
            while len(self._live) > self.KEEP:  # a watch's worker keeps its runner for many runs' builds
                gone = next(iter(self._live))
                stale.append(self._live.pop(gone))
                if gone in self._next:
                    _close_when_started(self._next.pop(gone))
        for old in stale:
            old.close()

    def _start_ahead(self, key: tuple, artifact: Path, env: dict[str, str], sandbox: Sandbox,
                     timeout_s: float) -> None:
        with self._lock:
            if self._starting is None:
                self._starting = ThreadPoolExecutor(max_workers=2, thread_name_prefix="abwatch-server-start")
            stale = [self._next.pop(key)] if key in self._next else []  # another thread's meanwhile
            self._next[key] = self._starting.submit(self._start, artifact, env, sandbox, timeout_s)
            while len(self._next) > self.KEEP:  # successors of servers no run takes again
                stale.append(self._next.pop(next(iter(self._next))))
        for future in stale:
            _close_when_started(future)

    def discard(self, side: str, artifact: Path, env: dict[str, str]) -> None:
        """Close the (side, build, environment)'s live server and successor, if any: no child
        will be asked of them."""
        key = (side, artifact, tuple(sorted(env.items())))
        with self._lock:
            server, successor = self._live.pop(key, None), self._next.pop(key, None)
        if server is not None:
            server.close()
        if successor is not None:
            _close_when_started(successor)

    def close(self) -> None:
        """Close every live server and every successor (waiting for those still starting)."""
        with self._lock:
            live, self._live = list(self._live.values()), {}
            ahead, self._next = list(self._next.values()), {}
            starting, self._starting = self._starting, None
        for server in live:
            server.close()
        for future in ahead:
            _close_when_started(future)
        if starting is not None:
            starting.shutdown(wait=True)


def _close_when_started(future: Future[TimedServer]) -> None:
    """Close a successor once it has started (at once if it has; none if its start failed)."""
    def close(done: Future[TimedServer]) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result().close()
    future.add_done_callback(close)


def from_child(server: Worker, timeout_s: float, what: str = "counted") -> dict:
    """A forked child's reply; WorkerError if the child died first (its server then says so,
    naming it a ``what`` worker)."""
    reply = server.receive(timeout_s)
    if "forked" in reply:
        raise WorkerError(child_ended(reply, server, what))
    return reply


def child_ended(reply: dict, server: Worker, what: str = "counted") -> str:
    """What a server says of a child that ended (its ``{"forked": true}`` reply), as an error."""
    status = reply.get("status")
    # Valgrind 3.19 decodes no AVX-512: code compiled for such a host's CPU stops it with SIGILL
    hint = (" (SIGILL: an instruction the counter cannot run, such as AVX-512 under Valgrind)"
            if status == -4 and what == "counted" else "")
    tail = server.tail()
    return f"{what} worker ended with status {status}{hint}" + (f": {tail}" if tail else "")
