"""Counting a region of the TVM harness worker: the instructions of the compile call, or of
the timed calls, without interpreter start-up and ``import tvm``.

Loaded by ``tvm_worker.py`` from its own directory, in the build's Python: standard library
only, never abwatch. What a region reports is read back by the counter abwatch ran the
worker under (``runners/counters.py``, ``read_region``):

* ``valgrind``: ``{"marks": [pid, pid]}``: two children forked just before and just after the
  region, each exiting at once. Cachegrind writes one count per process and a forked child
  starts from its parent's count, so the second child's count minus the first's is the
  region's (plus the few fixed instructions of one fork), whatever came before;
* ``perf``: ``{"count": n}``: the hardware counter of user-space instructions, opened here
  with ``perf_event_open`` (inherited by threads started inside the region), read after.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

# perf_event_open(2): the syscall's number per machine, the attribute's layout and its flags
_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
_HARDWARE, _INSTRUCTIONS = 0, 1
_DISABLED, _INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 5, 1 << 6
_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5; the rest of the structure is zero
_ENABLE, _DISABLE, _RESET = 0x2400, 0x2401, 0x2403

# The counters a region is counted for here: the names of ``runners.counters.COUNTERS``, written
# again because this file is loaded apart from abwatch (tests/test_toy_plugins.py checks the two).
COUNTERS = ("perf", "valgrind")


class RegionError(RuntimeError):
    """The region cannot be counted here (the message says why)."""


def _mark() -> int:
    """Fork a child that exits at once; its pid names the count it leaves behind."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # no atexit handlers, no flushing: the same few instructions every time
    os.waitpid(pid, 0)
    return pid


class Region:
    """Counts the instructions between :meth:`start` and :meth:`stop` for one counter."""

    def __init__(self, counter: str) -> None:
        if counter not in COUNTERS:
            raise RegionError(f"unknown counter {counter!r}")
        self.counter, self.marks, self.fd = counter, list[int](), -1
        self.libc = ctypes.CDLL(None, use_errno=True)
        if counter == "perf":
            self.fd = self._open()

    def _open(self) -> int:
        number = _SYSCALL.get(platform.machine())
        if number is None:
            raise RegionError(f"perf_event_open: no syscall number known for {platform.machine()}")
        attr = bytearray(_ATTR_SIZE)
        struct.pack_into("IIQ", attr, 0, _HARDWARE, _ATTR_SIZE, _INSTRUCTIONS)
        struct.pack_into("Q", attr, 40, _DISABLED | _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV)
        buffer = (ctypes.c_char * _ATTR_SIZE).from_buffer(attr)
        fd = self.libc.syscall(number, buffer, 0, -1, -1, 0)  # this process, any CPU
        if fd < 0:
            raise RegionError(f"perf_event_open: {os.strerror(ctypes.get_errno())}")
        return int(fd)

    def start(self) -> None:
        """Begin counting."""
        if self.counter == "valgrind":
            self.marks = [_mark()]
        else:
            self.libc.ioctl(self.fd, _RESET, 0)
            self.libc.ioctl(self.fd, _ENABLE, 0)

    def stop(self) -> dict:
        """Stop counting; what the counter reads the region's instructions from."""
        if self.counter == "valgrind":
            return {"marks": [*self.marks, _mark()]}
        self.libc.ioctl(self.fd, _DISABLE, 0)
        value = os.read(self.fd, 8)
        os.close(self.fd)
        return {"count": struct.unpack("Q", value)[0]}
