"""What a TVM worker's timed region used: wall time, CPU time, preemptions and peak memory.

Loaded by ``tvm_worker.py`` beside it (inside a build's own Python: standard library only).
The figures cover the timing batch alone: the import, compile and load before it would dilute a
change. The peak resident memory is Linux's high-water mark (``VmHWM``), reset before the batch
by writing 5 to ``/proc/self/clear_refs`` (Linux 4.0 and later), so it is the batch's own peak;
where it cannot be reset (another kernel) no peak is reported rather than the compile's.
"""

from __future__ import annotations

import resource
import time

CLEAR_REFS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"


def start() -> tuple[resource.struct_rusage, float, bool]:
    """Before the batch: this process's usage so far, the clock, and whether its peak resident
    memory was reset (so that :func:`figures` may report the batch's own)."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    return resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), reset


def figures(before: resource.struct_rusage, started: float, reset: bool) -> dict:
    """After the batch begun by :func:`start`: its wall time, this process's CPU time over it
    (user + system, every thread), its involuntary context switches and, where the peak was
    reset, its peak resident memory in KiB."""
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    return {"wall_s": wall,
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "involuntary_switches": after.ru_nivcsw - before.ru_nivcsw,
            "max_rss_kb": peak_kb() if reset else None}


def peak_kb() -> int | None:
    """This process's peak resident memory in KiB (``VmHWM``: since start, or since the last
    reset), None where ``/proc`` does not say."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
