"""The sandbox every child of code under test runs in (bubblewrap, ``bwrap``).

Builds, ``command`` and ``script:`` workloads and TVM harness workers are code that anyone
who can push has written. :func:`procs.run_process` and the TVM worker start them through
:meth:`Sandbox.wrap`, which runs them under ``bwrap`` with:

* a user namespace in which they are uid/gid 65534 (``nobody``) with no capabilities;
* their own PID namespace and a fresh ``/proc``: abwatch's process (its environment, its
  memory) is not there to read, and ``$PPID`` is the sandbox's own init;
* their own mount namespace: the host read-only, the paths the caller names writable, a
  private writable ``TMPDIR`` (the host's ``/tmp`` stays readable), and what may hold a
  secret hidden (the config file, PostgreSQL's socket directories and sockets, password
  files, ``[sandbox] hide``);
* for workloads, their own network namespace (no network at all, loopback included) unless
  ``[sandbox] network = true``; builds keep the network (pip needs its index);
* ``--die-with-parent`` (children waited for): nothing of it outlives abwatch; and when its
  first process ends, the PID namespace goes with every process left in it.

The policy is set once per process by :func:`configure` (the service does it at start, from
the config's ``[sandbox]`` section). Where ``bwrap`` is missing or cannot make namespaces
(no user namespaces), :func:`configure` returns a warning that names what is missing and
children run as before (``mode = "on"`` refuses instead).

This module imports nothing from abwatch but the spec, so builders and runners can use it.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from abwatch.builders.spec import SandboxConfig, UsageError

NOBODY = "65534"  # the uid and gid code under test has inside its user namespace
# Where secrets live on a host, hidden whether or not the operator lists them: PostgreSQL's
# socket directories (a socket needs no password under peer or trust authentication) and the
# usual password files.
DEFAULT_HIDDEN = ("/run/postgresql", "/var/run/postgresql", "/tmp/.s.PGSQL.*", "/etc/shadow", "/etc/gshadow",
                  "~/.pgpass", "~/.git-credentials", "~/.netrc", "~/.docker/config.json")


class SandboxUnavailable(UsageError):
    """``[sandbox] mode = "on"`` but this host cannot make the sandbox (the message says why)."""


@dataclass(frozen=True)
class Policy:
    """How this process sandboxes its children (set by :func:`configure`)."""

    enabled: bool
    bwrap: str = "bwrap"
    network: bool = False  # for workloads; builds always have it
    hidden: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()  # [sandbox] writable: for every child


_BASE = ["--unshare-user", "--uid", NOBODY, "--gid", NOBODY, "--unshare-pid",
         "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]


@functools.cache
def probe(bwrap: str) -> str | None:
    """What this host lacks to sandbox with ``bwrap`` (``None``: nothing, it works)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"{bwrap} (bubblewrap) is not installed (Debian: apt-get install bubblewrap)"
    argv = [path, *_BASE, "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} did not run: {exc}"
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"status {proc.returncode}"]
        return (f"{bwrap} cannot make user, PID, mount and network namespaces here ({why[0]}); "
                "user namespaces may be off (sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces)")
    return None


def _default_policy() -> Policy:
    # Until configure() runs (a test, a library caller): sandbox where the host can, hiding the defaults.
    return Policy(enabled=probe("bwrap") is None, bwrap=shutil.which("bwrap") or "bwrap", hidden=DEFAULT_HIDDEN)


_policy: Policy | None = None


def policy() -> Policy:
    """This process's sandbox policy."""
    global _policy
    if _policy is None:
        _policy = _default_policy()
    return _policy


def configure(settings: SandboxConfig, hide: Iterable[str | os.PathLike] = ()) -> str | None:
    """Set this process's policy from ``[sandbox]``; ``hide``: more paths to hide (the config
    file). Returns a warning for stderr when code under test will run without a sandbox;
    raises :class:`SandboxUnavailable` when ``mode = "on"`` and the host cannot sandbox."""
    global _policy
    hidden = (*DEFAULT_HIDDEN, *(str(p) for p in hide), *settings.hide)
    if settings.mode == "off":
        _policy = Policy(enabled=False)
        return ("WARNING: [sandbox] mode = \"off\": builds and workloads run unsandboxed and can read "
                "abwatch's environment and memory (its secrets) through /proc")
    missing = probe(settings.bwrap)
    if missing is not None:
        if settings.mode == "on":
            raise SandboxUnavailable(f"[sandbox] mode = \"on\" but this host cannot sandbox: {missing}")
        _policy = Policy(enabled=False)
        return (f"WARNING: no sandbox for code under test: {missing}. Builds and workloads run "
                "unsandboxed and can read abwatch's environment and memory (its secrets) through /proc")
    _policy = Policy(enabled=True, bwrap=shutil.which(settings.bwrap) or settings.bwrap, network=settings.network,
                     hidden=hidden, writable=tuple(os.path.expanduser(p) for p in settings.writable))
    return None


def reset() -> None:
    """Forget the configured policy (the next child uses the defaults again)."""
    global _policy
    _policy = None


@dataclass(frozen=True)
class Sandbox:
    """What one sandboxed child may do beyond reading the host: the paths it may write, and
    whether it has the network (``None``: as ``[sandbox] network`` says, the workloads' rule)
    and which device nodes (a GPU's: ``/dev/nvidia0``, ``/dev/dri/renderD128``, ...)."""

    writable: tuple[Path | str, ...] = field(default=())
    network: bool | None = None
    devices: tuple[str, ...] = field(default=())

    @property
    def active(self) -> bool:
        """Whether children started through this are sandboxed (the host can, and it is on)."""
        return policy().enabled

    def wrap(self, argv: Iterable[str], cwd: Path | str | None, tmpdir: Path | str | None,
             die_with_parent: bool = True, usage_fd: int | None = None) -> list[str]:
        """``argv`` as run in the sandbox (unchanged where the policy is off), in ``cwd``, with
        ``tmpdir`` (a directory the caller made and removes) as its writable ``TMPDIR``.

        ``die_with_parent``: killed when the *thread* that starts it ends (the kernel's parent
        death signal follows the thread): right for a child its caller waits for, wrong for a
        long-lived one another thread may use later (a fork server). ``usage_fd``: a pipe's
        writing end (inherited) to which :data:`USAGE` reports the command's resource usage."""
        rules = policy()
        if not rules.enabled:
            return list(argv)
        network = rules.network if self.network is None else self.network
        args = [rules.bwrap, *_BASE, *(["--die-with-parent"] if die_with_parent else []),
                *([] if network else ["--unshare-net"]),
                "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        for node in self.devices:  # a GPU's driver needs its nodes; --dev makes only the harmless ones
            args += ["--dev-bind", node, node]
        for path in _hidden(rules.hidden):
            args += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        # after the hidden ones: a writable path under a hidden directory is there again
        for writable in (*rules.writable, *self.writable, *([tmpdir] if tmpdir else [])):
            real = os.path.realpath(writable)
            os.makedirs(real, exist_ok=True)  # a directory the child is to make (ccache's) is bound too
            args += ["--bind", real, real]
        if tmpdir:
            args += ["--setenv", "TMPDIR", os.path.realpath(tmpdir)]
        if cwd is not None:
            args += ["--chdir", os.path.realpath(cwd)]
        if usage_fd is not None:
            argv = [sys.executable, "-I", "-S", "-c", USAGE, str(usage_fd), *argv]
        return [*args, "--", *argv]


# Inside the sandbox, between bubblewrap and the command: runs the command and reports its
# CPU seconds, involuntary context switches, wall seconds and peak resident kilobytes ("cpu
# switches wall maxrss") on the inherited descriptor. The wall time is the command's alone: setting up the sandbox (tens of
# milliseconds, the same on both sides) would dilute every change measured on a short process.
# bubblewrap's own process never waits for the sandbox's processes, so wait4 on it sees none of
# their CPU time. The descriptor is closed in the command: it cannot write a figure of its own.
USAGE = """import os, signal, sys, time
fd = int(sys.argv[1]); os.set_inheritable(fd, False)
started = time.monotonic()
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        sys.stderr.write(f"{sys.argv[2]}: {exc.strerror}\\n"); os._exit(127)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda n, _: os.kill(pid, n))
_, status, usage = os.wait4(pid, 0)
wall = time.monotonic() - started
os.write(fd, f"{usage.ru_utime + usage.ru_stime} {usage.ru_nivcsw} {wall} {usage.ru_maxrss}".encode()); os.close(fd)
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL); os.kill(os.getpid(), -code)
sys.exit(code)
"""


def _hidden(patterns: Iterable[str]) -> list[str]:
    """The existing paths ``patterns`` name (``~`` expanded, globs matched, symlinks resolved)."""
    found: dict[str, None] = {}
    for pattern in patterns:
        for path in glob.glob(os.path.expanduser(pattern)) if "*" in pattern else [os.path.expanduser(pattern)]:
            real = os.path.realpath(path)
            if os.path.lexists(real) and real != "/":
                found[real] = None
    return list(found)


BUILD = Sandbox(network=True)  # a build with no path of its own to write (pip into a venv names it)
WORKLOAD = Sandbox()
