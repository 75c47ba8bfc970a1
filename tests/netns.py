"""Several hosts on one machine: Linux network namespaces joined by veth pairs to a bridge.

Each :class:`Host` is a network namespace with an address of its own on a private /24, its own
hostname (a UTS namespace: ``abwatch`` names its workers ``host:pid``), and whatever processes a
test starts in it; the machine's own namespace is the "services" side of the network, at the
bridge's address. The machine's PostgreSQL (and Redis) listen on 127.0.0.1 only, so a
:meth:`Network.forward` (socat, one process per port) makes them reachable at the bridge's
address, the way a service host's firewall would let the fleet in; socat's TCP keepalive closes
a connection whose far end went silent, so a host cut off long enough loses its database
sessions (and their advisory locks) as a host cut off from a real server would.

Needs root and ``ip`` (iproute2) and ``socat``; a test that cannot have them is skipped by the
fixture with the reason (CI runs as root and has both: scripts/test.sh installs socat).
Addresses are only ever those of the namespaces made here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# keepalive of the forwarded connections: a peer silent for ~10 s is dropped
KEEPALIVE = "keepalive,keepidle=4,keepintvl=2,keepcnt=3"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def missing() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "socat", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"abwp{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One host: a network namespace, its veth, its address, the processes started in it."""

    name: str
    netns: str
    address: str
    outside: str  # the veth end on the bridge (taken down to cut the host off)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` on this host (its namespace, its hostname), output appended to ``log``."""
        wrapped = ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--",
                   "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *argv]
        with log.open("a") as out:
            proc = subprocess.Popen(wrapped, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.processes.append(proc)
        return proc

    def cut(self) -> None:
        """Take the host's link down: nothing reaches it, it reaches nothing."""
        _ip("link", "set", self.outside, "down")

    def restore(self) -> None:
        """Bring the host's link back up."""
        _ip("link", "set", self.outside, "up")

    def kill_all(self) -> None:
        """SIGKILL every process group started on this host (the host dies)."""
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Network:
    """A bridge on the machine, hosts attached to it, and forwarders of local services.

    Use as a context manager: everything made is removed on exit, processes killed first.
    """

    def __init__(self) -> None:
        self.tag = secrets.token_hex(2)  # interface names are at most 15 characters
        self.subnet = 200 + int(self.tag, 16) % 50
        self.bridge = f"abw{self.tag}br"
        self.address = f"10.213.{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self.forwarders: list[subprocess.Popen] = []

    def __enter__(self) -> Network:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def __exit__(self, *exc) -> None:
        for host in self.hosts.values():
            host.kill_all()
        for proc in self.forwarders:
            proc.kill()
            proc.wait()
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.outside, check=False)
        _ip("link", "del", self.bridge, check=False)

    def host(self, name: str) -> Host:
        """A new host called ``name`` on the bridge."""
        index = len(self.hosts) + 1
        netns, outside, inside = f"abw{self.tag}{index}", f"abw{self.tag}h{index}", f"abw{self.tag}i{index}"
        address = f"10.213.{self.subnet}.{10 + index}"
        _ip("netns", "add", netns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", netns, "link", "set", inside, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        self.hosts[name] = Host(name, netns, address, outside)
        return self.hosts[name]

    def forward(self, port: int, to: str = "127.0.0.1") -> str:
        """Make ``to:port`` on the machine reachable at the bridge's address; ``address:port``."""
        proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={self.address},fork,reuseaddr,{KEEPALIVE}", f"TCP:{to}:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.forwarders.append(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # listening: a connect from the machine succeeds
            probe = subprocess.run(["socat", "-u", "OPEN:/dev/null", f"TCP:{self.address}:{port},connect-timeout=1"],
                                   capture_output=True)
            if probe.returncode == 0:
                return f"{self.address}:{port}"
            time.sleep(0.2)
        raise RuntimeError(f"socat did not listen on {self.address}:{port}")
