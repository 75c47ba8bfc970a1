"""What a TVM worker's timed region used: wall time, CPU time, preemptions and peak memory.

Loaded by ``tvm_worker.py`` beside it (inside a build's own Python: standard library only).
The figures cover the timing batch alone: the import, compile and load before it would dilute a
change. The peak resident memory is Linux's high-water mark (``VmHWM``), reset before the batch
by writing 5 to ``/proc/self/clear_refs`` (Linux 4.0 and later), so it is the batch's own peak;
where it cannot be reset (another kernel) no peak is reported rather than the compile's.
Each sample's own CPU time is marked too (:class:`SampleClock`): on a busy host a long sample
is preempted several times, so its wall time carries other processes' time slices and no
sample of a process may be a clean one; its CPU time does not.
"""

from __future__ import annotations

import os
import resource
import time

CLEAR_REFS = "/proc/self/clear_refs"
MARK = "abwatch.usage.mark_sample"  # the time evaluator's f_preproc: called before each timed repeat
# samples are marked from this long (CPU seconds) on: where a contended sample is likely to be
# preempted and a mark's colder caches are a small part of it (measured: ~8 us of a 0.8 ms one)
MARK_MIN_S = 0.005
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
    (user + system, every thread), its involuntary context switches, where the peak was reset
    its peak resident memory in KiB, when it began (``began``: ``time.monotonic()``, a clock every
    process of the host shares) and the CPUs it could run on."""
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    return {"wall_s": wall, "began": time.monotonic() - wall, "cpus": sorted(os.sched_getaffinity(0)),
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


class SampleClock:
    """Each timed sample's CPU time (this process's, every thread), from marks that TVM's time
    evaluator makes before each repeat (its ``f_preproc``, :data:`MARK`) and one after the last.
    A mark's own cost (a call into Python, a few microseconds) is in every sample alike; the
    last sample also carries the evaluator's return, the same on both sides of a comparison."""

    name = MARK

    def __init__(self, tvm) -> None:
        self.marks: list[int] = []
        tvm.register_global_func(MARK, self._mark, override=True)
        # the evaluator's result is summed up in Python after the last sample, with numpy, whose
        # first use of those functions in a process cost ~13 ms of CPU: paid here instead
        tvm.runtime.module.BenchmarkResult([0.0, 1.0])

    def _mark(self, *_args) -> None:
        self.marks.append(time.process_time_ns())

    def begin(self) -> None:
        """Before the timer is called: forget earlier marks."""
        self.marks.clear()

    def samples_ms(self, count: int) -> list[float] | None:
        """Right after the timer returned ``count`` samples: each one's CPU time in ms (None
        where the evaluator did not mark every repeat)."""
        marks = [*self.marks, time.process_time_ns()]
        if len(marks) != count + 1:
            return None
        return [(after - before) / 1e6 for before, after in zip(marks[:-1], marks[1:], strict=True)]
