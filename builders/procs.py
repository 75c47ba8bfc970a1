"""Child processes of builds and workloads: a clean environment and a time limit that holds.

Everything abwatch runs on behalf of the code under test goes through :func:`run_process`
(or starts its long-lived process with :func:`child_env` and :func:`kill_tree`):

* the child gets an environment built from an allow-list plus what the config names, so
  secrets in abwatch's own environment (``ABWATCH_DATABASE_URL`` and its password, tokens)
  never reach a build script or a benchmark that may print them into a stored log;
* the child starts in its own session (process group), and a timeout kills the group and
  every descendant still attached to it;
* output is read by threads, so a descendant that keeps stdout open after the timeout
  cannot hold the caller: reading stops at the limit, whatever is still open;
* only a bounded tail of each stream is held (``keep`` bytes): a build that prints a
  gigabyte costs abwatch a few megabytes, and the result says how much was cut;
* the child runs in the sandbox its caller names (:mod:`abwatch.builders.sandbox`), and
  every known secret's value is masked in what it printed (:func:`~abwatch.core.redact.mask_secrets`).

This module imports nothing from abwatch, so builders and runners can use it freely.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import os
import shutil
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator, Mapping, Sequence

import psutil

from abwatch.core.redact import mask_secrets
from abwatch.core.commit_info import storable
from abwatch.builders.limits import enter, make_cgroup
from abwatch.builders.sandbox import Sandbox, policy, reachable

POLL_S = 0.1  # how often a running child is checked for its limits

# What a build or a benchmark may see of abwatch's own environment. Everything else
# (database URLs, tokens, cloud credentials) must be named in the config to be passed.
SAFE_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE", "TMPDIR",
    "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES",
    "CC", "CXX", "CCACHE_DIR", "PKG_CONFIG_PATH",
    # package installs of the tvm-wheel builder honour the machine's pip setup and proxies
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_NO_INDEX",
    "PIP_TRUSTED_HOST", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
})
SAFE_ENV_PREFIXES = ("LC_",)
GRACE_S = 2.0  # how long the reader threads may still take after the child is killed
KEEP_BYTES = 4 * 2**20  # the tail of a stream held when the caller sets no max_output


def child_env(*extra: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of this process's environment, updated with ``extra`` in order."""
    env = {name: value for name, value in os.environ.items()
           if name in SAFE_ENV or name.startswith(SAFE_ENV_PREFIXES)}
    for mapping in extra:
        env.update(mapping)
    return env


TAG_VAR = "ABWATCH_PROCESS_TAG"


def passed(names: Sequence[str]) -> dict[str, str]:
    """The variables ``names`` of this process's environment that are set (a config's ``pass_env``)."""
    return {name: os.environ[name] for name in names if name in os.environ}


def kill_tree(pid: int, tag: str | None = None) -> None:
    """Kill process ``pid``, its process group and every descendant that is still findable.

    A descendant that started its own session and whose parent already exited is no longer
    a child of anything we know; with ``tag`` (the value of ``$ABWATCH_PROCESS_TAG`` that
    :func:`run_process` gave the child, which its descendants inherit) it is found anyway.
    """
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    if tag is not None:
        descendants += _tagged(tag)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the child leads its own group (start_new_session)
    for proc in descendants:  # also those that started a session of their own
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG_VAR) == tag:
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


@dataclass(frozen=True)
class ProcessResult:
    """How a bounded child process ended."""

    returncode: int | None  # None when it was killed at the time limit
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool
    overflowed: bool = False  # killed for printing more than max_output bytes on one stream
    cut: int = 0  # bytes of stdout not kept (only its last ``keep`` bytes are)
    # what the child (with the descendants it waited for) used, from wait4: CPU seconds (user +
    # system) and how often the kernel took the CPU from it; None where it was not reaped here
    cpu_s: float | None = None
    involuntary_switches: int | None = None
    max_rss_kb: int | None = None  # peak resident memory of the child (its largest waited-for process)
    out_of_memory: bool = False  # the kernel killed it for passing its cgroup's memory limit


@dataclass(frozen=True)
class Placement:
    """Where and when a measured process starts: one side of a duet pair (``[run] schedule =
    "duet"``). The process runs pinned to ``cpus``; ``together`` is called just before the work
    both sides time together begins (a command's start, a TVM worker's timing batch), so the two
    sides of a pair begin it at the same moment and see the same interference."""

    cpus: frozenset[int]
    together: Callable[[], None] | None = None


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """The calling thread pinned to ``cpus`` while the block runs (nothing with None).

    Linux keeps an affinity per thread and a child inherits its forking thread's: a process
    started in the block runs on ``cpus`` from its first instruction (no window in which it
    runs elsewhere, as pinning it by pid after the start would leave), through any wrapper
    that execs it (bubblewrap, a cgroup's entry), while abwatch's other threads keep theirs.
    """
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# The kernel's parent-death signal (PR_SET_PDEATHSIG, bubblewrap's ``--die-with-parent``)
# follows the *thread* that started a process, not the process. A long-lived child that later
# threads use (a TVM worker, a fork server) is therefore started from this one thread, which
# lives as long as abwatch: such a child dies with abwatch, even when abwatch is SIGKILLed,
# and never with the short-lived thread that happened to need it first.
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="abwatch-launcher")


def launch(argv: Sequence[str], cpus: frozenset[int] | None = None, **popen: object) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` started from abwatch's launcher thread (pinned to
    ``cpus`` when given, see :func:`pinned`), for a long-lived child in the sandbox (which
    wraps it with ``--die-with-parent``): it lives until it ends or abwatch does, whichever
    thread asked."""
    def start() -> subprocess.Popen:
        with pinned(cpus):
            return subprocess.Popen(list(argv), **popen)  # type: ignore[call-overload]

    return _LAUNCHER.submit(start).result()


def cut_log(text: str, limit: int, cut_bytes: int = 0) -> str:
    """The last ``limit`` characters of a log, marked at its start when anything was cut
    (``cut_bytes``: what :func:`run_process` already left out)."""
    if len(text) <= limit and not cut_bytes:
        return text
    tail = mask_secrets(text[-limit:], cut=True)  # it may start inside a secret
    lost = cut_bytes + len(text.encode("utf-8", "replace")) - len(tail.encode("utf-8", "replace"))
    return f"[abwatch: log cut: its first {lost} bytes are not kept; the last {len(tail)} characters follow]\n{tail}"


def run_process(argv: Sequence[str], *, cwd: Path | str | None, env: Mapping[str, str], timeout_s: float,
                sandbox: Sandbox | None, merge_stderr: bool = False, max_output: int | None = None,
                keep: int | None = None, placement: Placement | None = None) -> ProcessResult:
    """Run ``argv`` (an argument list, never a shell string) for at most ``timeout_s`` seconds.

    Raises ``OSError`` when the program cannot be started. ``sandbox``: what the child may
    touch (``None`` only for abwatch's own tools, never for code under test). With
    ``merge_stderr`` the child's stderr goes into ``stdout`` (build logs keep the order of
    both). With ``max_output``, a stream that passes that many bytes is read no further and
    the whole process tree is killed (``overflowed``). Of each stream only the last ``keep``
    bytes are held (default ``max_output``, else :data:`KEEP_BYTES`); ``cut`` says how many
    bytes of stdout were left out before them. With ``placement`` the child starts pinned to its
    CPUs, after its ``together`` returns (a duet's side, :class:`Placement`).
    """
    with contextlib.ExitStack() as stack:
        keep = keep if keep is not None else max_output or KEEP_BYTES
        # code under test, sandboxed or not: its limits, and one place to find all it started
        cgroup = make_cgroup(policy().limits) if sandbox is not None else None
        if cgroup is not None:
            stack.callback(cgroup.close)  # what the child left in it is killed
        if sandbox is not None and sandbox.active:  # a private, writable TMPDIR, removed after the child
            _startable(argv[0], cwd, env)  # as Popen would say, not as bwrap's exit status
            problem = reachable(cwd) if cwd is not None else None
            if problem:
                raise PermissionError(errno.EACCES, problem, str(cwd))
            tmpdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="abwatch-tmp-", ignore_cleanup_errors=True))
            usage_r, usage_w = os.pipe()  # the command's CPU figures, from inside (sandbox.USAGE)
            stack.callback(os.close, usage_r)
            argv = sandbox.wrap(argv, cwd, tmpdir, usage_fd=usage_w,
                                cgroup_procs=cgroup.procs_files if cgroup else ())
            try:
                result = _run(argv, cwd, env, timeout_s, merge_stderr, max_output, keep, pass_fds=(usage_w,),
                              sweep=cgroup is None, placement=placement)
            finally:
                os.close(usage_w)
            result = _inner_usage(result, usage_r)
        else:
            if cgroup is not None:
                argv = enter(cgroup.procs_files, list(argv))
            result = _run(argv, cwd, env, timeout_s, merge_stderr, max_output, keep, sweep=cgroup is None,
                          placement=placement)
        if cgroup is not None and cgroup.oom_killed():
            result = dataclasses.replace(result, out_of_memory=True)
        return result


def _inner_usage(result: ProcessResult, usage_r: int) -> ProcessResult:
    """``result`` with the sandboxed command's own CPU figures, wall time and the signal that
    ended it, where it reported them (a command killed at its time limit did not: bubblewrap's
    own figures stay)."""
    os.set_blocking(usage_r, False)
    try:
        cpu, switches, wall, peak, killed = os.read(usage_r, 160).decode().split()
        result = dataclasses.replace(result, cpu_s=float(cpu), involuntary_switches=int(switches),
                                     wall_s=float(wall), max_rss_kb=int(peak))
        if int(killed) and result.returncode is not None:  # bubblewrap says 128 + N; the command was killed
            result = dataclasses.replace(result, returncode=-int(killed))
        return result
    except (OSError, ValueError):  # nothing written (killed), or not five numbers
        return result


def status(proc: ProcessResult) -> str:
    """``status N`` for a child that exited, how it was killed otherwise (:func:`ending`)."""
    return f"status {proc.returncode}" if proc.returncode is None or proc.returncode >= 0 else ending(proc)


def ending(proc: ProcessResult) -> str:
    """How a finished child ended, in words: ``exited with status N``, ``killed by SIGKILL``,
    ``killed by SIGKILL: out of memory (limit ...)``."""
    if proc.returncode is not None and proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        if proc.out_of_memory:
            limit = policy().limits.memory / 2**30
            return f"killed by {name}: out of memory (more than its limit, [sandbox] max_memory_gb = {limit:g})"
        return f"killed by {name}"
    return f"exited with status {proc.returncode}"


def _startable(program: str, cwd: Path | str | None, env: Mapping[str, str]) -> None:
    """Raise the ``OSError`` that starting ``program`` outside the sandbox would raise."""
    if os.sep in program:
        path = os.path.join(cwd or ".", program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _run(argv: Sequence[str], cwd: Path | str | None, env: Mapping[str, str], timeout_s: float,
         merge_stderr: bool, max_output: int | None, keep: int, pass_fds: tuple[int, ...] = (),
         sweep: bool = True, placement: Placement | None = None) -> ProcessResult:
    if placement is not None and placement.together is not None:
        placement.together()  # the last thing before the start: the other side starts now too
    start = time.monotonic()
    tag = uuid.uuid4().hex
    with pinned(placement.cpus if placement is not None else None):
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env={**env, TAG_VAR: tag}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, start_new_session=True, pass_fds=pass_fds,
        )
    waiter = _Reaper(proc)
    streams = {"stdout": proc.stdout} if merge_stderr else {"stdout": proc.stdout, "stderr": proc.stderr}
    tails = {name: _Tail(keep) for name in streams}
    overflow = threading.Event()
    readers = [threading.Thread(target=_read_all, args=(stream, tails[name], max_output, overflow), daemon=True)
               for name, stream in streams.items()]
    for reader in readers:
        reader.start()
    timed_out, overflowed = _wait(proc, waiter, tag, start + timeout_s, overflow)
    # The child has ended; a descendant may still hold the pipes. Wait for the readers only
    # as long as the limit allows, then leave them (they are daemons) and close our ends.
    deadline = start + timeout_s + GRACE_S
    for reader in readers:
        reader.join(timeout=max(0.0, deadline - time.monotonic()) if not timed_out else GRACE_S)
    # whatever it left running (a daemon, a detached spinner that would slow the next
    # invocation) belongs to this child: its group and every process carrying its tag (a
    # cgroup, where there is one, is emptied by its caller: ``sweep`` off)
    if sweep or any(reader.is_alive() for reader in readers):
        kill_tree(proc.pid, tag)
    for stream in streams.values():
        if stream is not None:
            stream.close()  # ours; a reader still blocked on it stops (ValueError, handled there)
    # build logs are stored: NUL and invalid UTF-8 in a child's output must not fail the row,
    # and a secret the child found (or was given) must not be stored or shown
    kept = {name: tail.data() for name, tail in tails.items()}
    text = {name: mask_secrets(storable(data, sys.maxsize), cut=tails[name].cut > 0) for name, data in kept.items()}
    usage = waiter.usage
    return ProcessResult(None if timed_out or overflowed else proc.returncode, text["stdout"],
                         text.get("stderr", ""), time.monotonic() - start, timed_out, overflowed,
                         tails["stdout"].cut, cpu_s=None if usage is None else usage.ru_utime + usage.ru_stime,
                         involuntary_switches=None if usage is None else usage.ru_nivcsw,
                         max_rss_kb=None if usage is None else usage.ru_maxrss)


def _wait(proc: subprocess.Popen, waiter: _Reaper, tag: str, deadline: float,
          overflow: threading.Event) -> tuple[bool, bool]:
    """Wait until the child ends, its time is up (``deadline``, monotonic), or a stream passed its
    limit (``overflow``); a child stopped is killed with its tree. Returns (timed out, overflowed)."""
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                waiter.wait(max(0.0, min(left, POLL_S)))
                return False, False
            except subprocess.TimeoutExpired:
                if not overflow.is_set() and left > POLL_S:
                    continue
                overflowed = overflow.is_set()
                kill_tree(proc.pid, tag)
                waiter.wait(None)
                return not overflowed, overflowed
    except BaseException:  # interrupted: the child must not outlive the run that started it
        kill_tree(proc.pid, tag)
        waiter.wait(None)
        raise


class _Reaper:
    """Waits for a child with ``os.wait4`` in a thread of its own, so its resource usage (CPU
    time, involuntary context switches: how contended it was) is kept, and the wait ends the
    moment the child does (``Popen.wait`` with a timeout polls, up to 50 ms late)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.usage: resource.struct_rusage | None = None
        self.done = threading.Event()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            _, status, self.usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)  # Popen will not wait for it again
        except ChildProcessError:  # reaped elsewhere; Popen knows its status
            self.proc.wait()
        finally:
            self.done.set()

    def wait(self, timeout: float | None) -> None:
        """Like ``Popen.wait(timeout)``: return once the child has ended, or raise ``TimeoutExpired``."""
        if not self.done.wait(timeout):
            raise subprocess.TimeoutExpired(self.proc.args, timeout or 0.0)


class _Tail:
    """The last ``keep`` bytes of a stream, held as a queue of the blocks read (a block more at most)."""

    def __init__(self, keep: int) -> None:
        self.keep, self.size, self.cut = keep, 0, 0
        self.blocks: deque[bytes] = deque()
        self.lock = threading.Lock()  # a reader left running past the limit may still add

    def add(self, block: bytes) -> None:
        with self.lock:
            self.blocks.append(block)
            self.size += len(block)
            while self.size - len(self.blocks[0]) >= self.keep:  # the rest still holds keep bytes
                self.size -= len(self.blocks[0])
                self.cut += len(self.blocks.popleft())

    def data(self) -> bytes:
        with self.lock:
            data = b"".join(self.blocks)
            extra = max(0, len(data) - self.keep)
            self.cut += extra
            self.blocks.clear()
            self.size = 0
            return data[extra:]


def _read_all(stream, into: _Tail, limit: int | None, overflow: threading.Event) -> None:
    size = 0
    try:
        for block in iter(lambda: stream.read1(65536), b""):
            size += len(block)
            if limit is not None and size > limit:
                overflow.set()  # the caller kills the tree; nothing more is kept
                return
            into.add(block)
    except (OSError, ValueError):  # closed under us after the limit
        pass
