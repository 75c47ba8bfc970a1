"""Limits on what one build or one invocation of code under test may take of the host.

A fork bomb or a memory bomb in a pull request must not stop the host (PostgreSQL runs
there too). Each sandboxed child gets, from ``[sandbox] max_processes`` and ``max_memory_gb``:

* where the host lets abwatch make cgroups (cgroup v2 with the ``memory`` and ``pids``
  controllers, or v1's ``memory`` and ``pids`` hierarchies): a cgroup of its own, entered
  before the child's first instruction (:data:`ENTER`), whose ``memory`` limit the kernel
  enforces by killing (``SIGKILL``, counted as an OOM kill, so the run can say "out of
  memory") and whose ``pids`` limit caps forks; what is left in it when the child ends is
  killed, and the cgroup removed;
* everywhere, inside the sandbox: ``RLIMIT_NPROC`` (counted in the sandbox's own user
  namespace, so per child, not per host user) and, without a cgroup, ``RLIMIT_DATA`` (the
  heap and private writable mappings of each process; address-space reservations such as a
  GPU driver's are not counted, which ``RLIMIT_AS`` would refuse).

This module imports nothing from abwatch.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "abwatch"  # the parent of every child's cgroup


@dataclass(frozen=True)
class Limits:
    """What one sandboxed child may take: processes at once, and bytes of memory."""

    processes: int
    memory: int


@functools.cache  # once per process: not a mkdir and two writes before every child
def _v2_parent() -> Path | None:
    controllers = ROOT / "cgroup.controllers"
    try:
        if not {"memory", "pids"} <= set(controllers.read_text().split()):
            return None
        parent = ROOT / GROUP
        parent.mkdir(exist_ok=True)
        # the root cgroup may hold processes and still hand controllers down; abwatch's
        # parent holds none, so its children may have them too
        (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
        return parent
    except OSError:
        return None


@functools.cache
def _v1_parents() -> tuple[Path, Path] | None:
    memory, pids = ROOT / "memory", ROOT / "pids"
    try:
        if not (memory / "memory.limit_in_bytes").exists() or not (pids / "cgroup.procs").exists():
            return None
        for hierarchy in (memory, pids):
            (hierarchy / GROUP).mkdir(exist_ok=True)
        return memory / GROUP, pids / GROUP
    except OSError:
        return None


class Cgroup:
    """One child's cgroup (v2: one directory; v1: one in ``memory`` and one in ``pids``)."""

    def __init__(self, dirs: tuple[Path, ...], memory_events: Path, v2: bool) -> None:
        self.dirs = dirs
        self.memory_events = memory_events
        self.v2 = v2

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to enter (:data:`ENTER`)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of it for passing the memory limit."""
        try:
            for line in self.memory_events.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value) > 0
        except (OSError, ValueError):
            pass
        return False

    def close(self) -> None:
        """Kill whatever is left in it and remove it."""
        for _ in range(50):
            left = set()
            for directory in self.dirs:
                with contextlib.suppress(OSError, ValueError):
                    left |= {int(pid) for pid in (directory / "cgroup.procs").read_text().split()}
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)  # a killed process leaves its cgroup only once reaped by its parent
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                directory.rmdir()


def make_cgroup(limits: Limits) -> Cgroup | None:
    """A cgroup holding ``limits`` for one child, or ``None`` where this host gives abwatch none
    (no write access to ``/sys/fs/cgroup``, or the controllers are elsewhere)."""
    name = uuid.uuid4().hex[:16]
    parent = _v2_parent()
    try:
        if parent is not None:
            group = parent / name
            group.mkdir()
            (group / "memory.max").write_text(str(limits.memory))
            with contextlib.suppress(OSError):  # no swap on the host: nothing to limit
                (group / "memory.swap.max").write_text("0")
            (group / "pids.max").write_text(str(limits.processes))
            return Cgroup((group,), group / "memory.events", v2=True)
        parents = _v1_parents()
        if parents is None:
            return None
        memory, pids = parents[0] / name, parents[1] / name
        memory.mkdir()
        pids.mkdir()
        (memory / "memory.limit_in_bytes").write_text(str(limits.memory))
        (pids / "pids.max").write_text(str(limits.processes))
        return Cgroup((memory, pids), memory / "memory.oom_control", v2=False)
    except OSError:
        return None


# Run as abwatch's user before the sandbox starts: puts its own process in the child's cgroup
# (every process it then starts is born there), then runs the rest of the command line. A fixed
# script whose arguments are the cgroup.procs files, "--" and the command (never interpolated):
# the shell starts in a millisecond, where Python would take tens of them on every invocation.
ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'


def enter(procs_files: list[str], argv: list[str]) -> list[str]:
    """``argv`` run inside the cgroup whose ``cgroup.procs`` files are ``procs_files``."""
    return ["/bin/sh", "-c", ENTER, "abwatch-cgroup", *procs_files, "--", *argv]
