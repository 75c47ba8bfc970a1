"""The sandbox every child of code under test runs in (bubblewrap, ``bwrap``).

Builds, ``command`` and ``script:`` workloads and TVM harness workers are code that anyone
who can push has written. :func:`procs.run_process` and the TVM worker start them through
:meth:`Sandbox.wrap`, which runs them under ``bwrap`` with:

* an unprivileged host user of their own: where abwatch runs as root, ``setpriv`` becomes
  ``[sandbox] user`` (``abwatch-sandbox``; ``nobody`` where that user is missing) before
  bubblewrap starts, so files only root or abwatch's user may read (``/etc/abwatch/fleet.env``,
  ``~/.ssh``) are unreadable whatever their path, hidden or not; inside, a user namespace in
  which they are uid/gid 65534 (``nobody``) with no capabilities;
* limits (:mod:`abwatch.builders.limits`): processes and memory per child;
* their own PID namespace and a fresh ``/proc``: abwatch's process (its environment, its
  memory) is not there to read, and ``$PPID`` is the sandbox's own init;
* their own mount namespace: the host read-only, the paths the caller names writable, a
  private writable ``TMPDIR`` (the host's ``/tmp`` stays readable), and what may hold a
  secret hidden (the config file, PostgreSQL's socket directories and sockets, password
  files, ``[sandbox] hide``);
* their own network namespace (no network at all, loopback included): builds always (what
  they install abwatch downloads first) unless ``[sandbox] build_network = true``, workloads
  unless ``[sandbox] network = true``; code nobody merged (:func:`untrusted`) never has one;
* ``--die-with-parent``: nothing of it outlives abwatch, even a SIGKILLed one (long-lived
  workers are started from a thread that lives as long as abwatch: ``procs.launch``); and
  when its first process ends, the PID namespace goes with every process left in it.

The policy is set once per process by :func:`configure` (the service does it at start, from
the config's ``[sandbox]`` section). Where ``bwrap`` is missing or cannot make namespaces
(no user namespaces), :func:`configure` returns a warning that names what is missing and
children run as before (``mode = "on"`` refuses instead).

This module imports nothing from abwatch but the spec and the limits, so builders and runners can use it.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import pwd
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from abwatch.core.errors import UsageError
from abwatch.builders.limits import Limits, enter
from abwatch.builders.spec import SandboxConfig

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
    network: bool = False  # for trusted workloads
    build_network: bool = False  # for trusted builds
    hidden: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()  # [sandbox] writable: for every child
    # the host user children run as (None: abwatch's own, where it is not root and cannot switch)
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    limits: Limits = field(default_factory=lambda: Limits(processes=512, memory=8 * 2**30))
    unsandboxed_untrusted: bool = False


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


def sandbox_user(name: str) -> tuple[str, int, int] | None:
    """The host user children run as: ``name``, else ``nobody``, where abwatch runs as root
    and can switch (``None``: abwatch is not root; children keep its user)."""
    if os.geteuid() != 0:
        return None
    for candidate in (name, "nobody"):
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return candidate, entry.pw_uid, entry.pw_gid
    raise SandboxUnavailable(f"[sandbox] user: neither {name!r} nor 'nobody' is a user of this host; make it: "
                             f"useradd --system --no-create-home --shell /usr/sbin/nologin {name}")


def _policy_for(settings: SandboxConfig, enabled: bool, bwrap: str, hidden: tuple[str, ...]) -> Policy:
    user = sandbox_user(settings.user) if enabled else None
    return Policy(enabled=enabled, bwrap=bwrap, network=settings.network, build_network=settings.build_network,
                  hidden=hidden, writable=tuple(os.path.expanduser(p) for p in settings.writable),
                  user=user[0] if user else None, uid=user[1] if user else None, gid=user[2] if user else None,
                  limits=Limits(processes=settings.max_processes, memory=int(settings.max_memory_gb * 2**30)),
                  unsandboxed_untrusted=settings.unsandboxed_untrusted)


def _default_policy() -> Policy:
    # Until configure() runs (a test, a library caller): sandbox where the host can, hiding the defaults.
    return _policy_for(SandboxConfig(), probe("bwrap") is None, shutil.which("bwrap") or "bwrap", DEFAULT_HIDDEN)


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
        _policy = _policy_for(settings, False, settings.bwrap, ())
        return ("WARNING: [sandbox] mode = \"off\": builds and workloads run unsandboxed and can read "
                "abwatch's environment and memory (its secrets) through /proc")
    missing = probe(settings.bwrap)
    if missing is not None:
        if settings.mode == "on":
            raise SandboxUnavailable(f"[sandbox] mode = \"on\" but this host cannot sandbox: {missing}")
        _policy = _policy_for(settings, False, settings.bwrap, ())
        return (f"WARNING: no sandbox for code under test: {missing}. Builds and workloads run "
                "unsandboxed and can read abwatch's environment and memory (its secrets) through /proc")
    _policy = _policy_for(settings, True, shutil.which(settings.bwrap) or settings.bwrap, hidden)
    # every sandboxed child starts with abwatch's interpreter (USAGE): its user must reach it
    unreachable = reachable(sys.executable, _policy) or reachable(os.path.realpath(sys.executable), _policy)
    if unreachable:
        _policy = None
        raise SandboxUnavailable(f"[sandbox]: {unreachable} (scripts/sandbox-user.sh does both for this host)")
    if _policy.user is not None and _policy.user != settings.user:
        return (f"note: [sandbox] user {settings.user!r} is not a user of this host: code under test runs as "
                f"{_policy.user!r} (make it: useradd --system --no-create-home --shell /usr/sbin/nologin "
                f"{settings.user})")
    return None  # not root: code under test keeps abwatch's uid (README, Security, says what that means)


class UntrustedRefused(UsageError):
    """Code nobody merged, and no sandbox to run it in (``[sandbox] unsandboxed_untrusted`` is off)."""


_untrusted = 0
_untrusted_lock = threading.Lock()


@contextlib.contextmanager
def untrusted() -> Iterator[None]:
    """While a try or pull-request job runs in this process, every child is code nobody merged:
    no network for builds or workloads, whatever the config says (refused without a sandbox,
    unless ``[sandbox] unsandboxed_untrusted``). Process-wide, not per thread: a trusted job
    running beside it loses the network too, never the other way round."""
    global _untrusted
    rules = policy()
    if not rules.enabled and not rules.unsandboxed_untrusted:
        raise UntrustedRefused("untrusted code (a try or pull-request job) is refused: this host runs code under "
                               "test without a sandbox (install bubblewrap, or set [sandbox] "
                               "unsandboxed_untrusted = true to accept the risk)")
    with _untrusted_lock:
        _untrusted += 1
    try:
        yield
    finally:
        with _untrusted_lock:
            _untrusted -= 1


def running_untrusted() -> bool:
    """Whether a try or pull-request job is running in this process (:func:`untrusted`)."""
    return _untrusted > 0


def reset() -> None:
    """Forget the configured policy (the next child uses the defaults again)."""
    global _policy
    _policy = None


@dataclass(frozen=True)
class Sandbox:
    """What one sandboxed child may do beyond reading the host: the paths it may write, and
    whether it has the network (``None``: as ``[sandbox] network`` says, the workloads' rule;
    ``build``: as ``[sandbox] build_network`` says; ``True``: always, the ``rpc`` runner's workers,
    whose tracker is on it) and which device nodes (a GPU's: ``/dev/nvidia0``,
    ``/dev/dri/renderD128``, ...). While a try or pull-request job runs (:func:`untrusted`) only
    a child that asks for the network by name has it."""

    writable: tuple[Path | str, ...] = field(default=())
    network: bool | None = None
    devices: tuple[str, ...] = field(default=())
    build: bool = False

    @property
    def active(self) -> bool:
        """Whether children started through this are sandboxed (the host can, and it is on)."""
        return policy().enabled

    def has_network(self) -> bool:
        """Whether a child started now gets the host's network."""
        rules = policy()
        if self.network is True:  # asked for by name: an RPC worker must reach its tracker
            return True
        if running_untrusted():
            return False
        if self.build:
            return rules.build_network
        return rules.network if self.network is None else self.network

    def wrap(self, argv: Iterable[str], cwd: Path | str | None, tmpdir: Path | str | None,
             usage_fd: int | None = None, cgroup_procs: Iterable[str] = ()) -> list[str]:
        """``argv`` as run in the sandbox (unchanged where the policy is off), in ``cwd``, with
        ``tmpdir`` (a directory the caller made and removes) as its writable ``TMPDIR``.

        The child is killed when the *thread* that starts it ends (``--die-with-parent``: the
        kernel's parent-death signal follows the thread): right for a child its caller waits
        for; a long-lived one that later threads use (a fork server) is started by
        :func:`abwatch.builders.procs.launch`, whose thread lives as long as abwatch. ``usage_fd``: a pipe's
        writing end (inherited) to which :data:`USAGE` reports the command's resource usage and
        how it ended. ``cgroup_procs``: the ``cgroup.procs`` files of the child's cgroup
        (:mod:`abwatch.builders.limits`), entered before the sandbox starts; without them the
        memory limit is each process's ``RLIMIT_DATA``."""
        rules = policy()
        if not rules.enabled:
            return list(argv)
        cgroup_procs = list(cgroup_procs)
        args = [rules.bwrap, *_BASE, "--die-with-parent",
                *([] if self.has_network() else ["--unshare-net"]),
                "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        for node in self.devices:  # a GPU's driver needs its nodes; --dev makes only the harmless ones
            args += ["--dev-bind", node, node]
        for path in _hidden(rules.hidden):
            args += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        # after the hidden ones: a writable path under a hidden directory is there again
        for writable in (*rules.writable, *self.writable, *([tmpdir] if tmpdir else [])):
            real = os.path.realpath(writable)
            os.makedirs(real, exist_ok=True)  # a directory the child is to make (ccache's) is bound too
            grant(real, rules)
            args += ["--bind", real, real]
        if tmpdir:
            args += ["--setenv", "TMPDIR", os.path.realpath(tmpdir)]
        if cwd is not None:
            args += ["--chdir", os.path.realpath(cwd)]
        limits = rules.limits
        # inside the sandbox, before the command: its limits (and, with usage_fd, its usage report)
        argv = [sys.executable, "-I", "-S", "-c", USAGE, str(-1 if usage_fd is None else usage_fd),
                str(limits.processes), "0" if cgroup_procs else str(limits.memory), *argv]
        command = [*args, "--", *argv]
        if rules.uid is not None:  # abwatch is root: the sandbox starts as the unprivileged host user
            command = ["setpriv", f"--reuid={rules.uid}", f"--regid={rules.gid}", "--clear-groups",
                       "--inh-caps=-all", "--bounding-set=-all", "--", *command]
        if cgroup_procs:
            command = enter(cgroup_procs, command)
        return command


def grant(path: str, rules: Policy | None = None) -> None:
    """Make ``path`` (a directory a child may write) and everything in it the sandbox user's,
    where children run as another user than abwatch's. Links are changed, never followed."""
    rules = rules or policy()
    if rules.uid is None or not rules.enabled:
        return
    uid, gid = rules.uid, rules.gid
    assert gid is not None

    def own(name: str, dir_fd: int | None) -> None:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if info.st_uid != uid or info.st_gid != gid:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)

    own(path, None)
    # fwalk holds each directory open and never follows a link into another: a child that swaps
    # a directory for a link to /etc meanwhile gets the link itself changed, nothing behind it
    for _, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                own(name, dir_fd)


def reachable(path: Path | str, rules: Policy | None = None) -> str | None:
    """Why the sandbox's user cannot reach ``path`` (a directory on the way it may not enter),
    or ``None``."""
    rules = rules or policy()
    if rules.uid is None or not rules.enabled:
        return None
    current = Path(os.path.abspath(path))
    for directory in [*reversed(current.parents), current]:
        try:
            info = os.stat(directory)
        except OSError:
            return None  # not there yet: whoever makes it says so
        if not stat.S_ISDIR(info.st_mode):
            continue
        bits = (stat.S_IXUSR if info.st_uid == rules.uid else
                stat.S_IXGRP if info.st_gid == rules.gid else stat.S_IXOTH)
        if not info.st_mode & bits:
            return (f"{directory} (mode {stat.S_IMODE(info.st_mode):o}, owner uid {info.st_uid}) cannot be "
                    f"entered by the sandbox's user {rules.user!r}, so code under test cannot reach {path}: "
                    f"chmod o+x {directory}, or keep abwatch and its cache_dir elsewhere")
    return None


# Inside the sandbox, between bubblewrap and the command: sets the command's limits, runs it,
# and reports its CPU seconds, involuntary context switches, wall seconds, peak resident
# kilobytes and the signal that ended it, 0 if none ("cpu switches wall maxrss signal"), on
# the inherited descriptor (-1: none). Arguments: the descriptor, the process limit, the
# memory limit per process (0: a cgroup holds it), the command.
# RLIMIT_NPROC counts the processes of the sandbox's user in its own user namespace: this
# child's, not every child's of the host user. The wall time is the command's alone: setting
# up the sandbox (tens of milliseconds, the same on both sides) would dilute every change
# measured on a short process. bubblewrap's own process never waits for the sandbox's
# processes, so wait4 on it sees none of their CPU time. The descriptor is closed in the
# command: it cannot write a figure of its own.
USAGE = """import os, resource, signal, sys, time
fd, nproc, memory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if memory:
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
if fd >= 0:
    os.set_inheritable(fd, False)
started = time.monotonic()
pid = os.fork()
if pid == 0:
    if fd >= 0:
        os.close(fd)
    try:
        os.execvp(sys.argv[4], sys.argv[4:])
    except OSError as exc:
        sys.stderr.write(f"{sys.argv[4]}: {exc.strerror}\\n"); os._exit(127)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, lambda n, _: os.kill(pid, n))
_, status, usage = os.wait4(pid, 0)
wall = time.monotonic() - started
killed = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
if fd >= 0:
    os.write(fd, f"{usage.ru_utime + usage.ru_stime} {usage.ru_nivcsw} {wall} {usage.ru_maxrss} {killed}".encode())
    os.close(fd)
if killed:  # end as the command did; SIGKILL and SIGSTOP keep their default action anyway
    if killed not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(killed, signal.SIG_DFL)
    os.kill(os.getpid(), killed)
sys.exit(os.waitstatus_to_exitcode(status))
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


BUILD = Sandbox(build=True)  # a build with no path of its own to write (pip into a venv names it)
WORKLOAD = Sandbox()
