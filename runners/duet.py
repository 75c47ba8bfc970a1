"""Duet runs: a pair's two sides measured at once, so that both see the same interference
(Bulej et al., ICPE 2020). ``[run] schedule = "duet"`` pins each side to a core of its own;
``"duet-one-cpu"`` pins both to one CPU, where they take turns in the scheduler's time slices
and are judged on CPU time (service/compare/contended.py): on a virtual machine each virtual
CPU has a speed of its own that changes by the second, which two CPUs at once do not share
and one CPU does (docs/statistics.md, "A duet on one CPU").

Which CPUs (:func:`choose_cores`, :func:`choose_cpu`, pure: from the CPUs this process may use
and their SMT siblings, read by :func:`host_cores`), and the pairs run (:func:`measure_duet`):
the slots of an interleaved schedule two at a time, one side of each pair on each of the two
CPUs (the same one, on one CPU), started together. The order (ABBA/BAAB) decides which side
gets which core, so each side has each core as often.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from abwatch.core.errors import UsageError
from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.builders.procs import Placement
from abwatch.runners.harness import Measurement, Slot, take
from abwatch.runners.results import InvocationResult

KEY = 'run.schedule = "duet"'  # how an error names the setting at fault
ONE_CPU = "duet-one-cpu"  # run.schedule's value for a duet on one CPU
SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Cores:
    """The two CPUs a duet runs on (one CPU twice: a duet on one CPU), and what the user must
    be told of them."""

    cpus: tuple[int, int]
    siblings: bool  # SMT siblings of one physical core: they share its execution units

    @property
    def one_cpu(self) -> bool:
        """Whether both sides run on one CPU, taking turns (judged on CPU time)."""
        return self.cpus[0] == self.cpus[1]

    @property
    def warning(self) -> str | None:
        """What to say of these two CPUs before measuring, or None."""
        if not self.siblings:
            return None
        return (f"{KEY}: CPUs {self.cpus[0]} and {self.cpus[1]} are SMT siblings of one physical core "
                "(no two separate cores are free to this process): the two sides compete for its execution "
                "units, and a difference can shrink")

    def describe(self) -> str:
        """The schedule as the report says it."""
        if self.one_cpu:
            return (f"duet on one CPU: each pair's two sides at once, both pinned to CPU {self.cpus[0]}, "
                    "judged on CPU time")
        return (f"duet: each pair's two sides at once, pinned to CPUs {self.cpus[0]} and {self.cpus[1]}"
                + (" (SMT siblings of one core)" if self.siblings else ""))


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a kernel CPU list (``0-3,8,10-11``)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def choose_cores(allowed: frozenset[int], siblings: Mapping[int, frozenset[int]]) -> Cores:
    """Two CPUs of ``allowed`` for a duet: two separate physical cores where there are (CPUs
    that are no SMT siblings of each other), else two siblings of one core (then
    :attr:`Cores.warning`). ``siblings[cpu]`` holds ``cpu``'s core's CPUs (itself included; a
    CPU missing from it has none). CPU 0 is left out while enough others are free: the kernel
    serves most interrupts and housekeeping there. Raises :class:`UsageError` naming the
    setting on fewer than two CPUs."""
    if len(allowed) < 2:
        raise UsageError(f"{KEY} runs a pair's two sides at once, each on a CPU of its own: this process may "
                         f"use {len(allowed)} CPU ({', '.join(map(str, sorted(allowed)))}; os.sched_getaffinity); "
                         'use schedule = "interleaved" here')
    ordered = sorted(allowed, key=lambda cpu: (cpu == 0, cpu))  # 0 last: chosen only when needed
    for first in ordered:
        for second in ordered:
            if second != first and second not in siblings.get(first, frozenset({first})):
                return Cores(tuple(sorted((first, second))), siblings=False)  # type: ignore[arg-type]
    return Cores(tuple(ordered[:2]), siblings=True)  # type: ignore[arg-type]


def choose_cpu(allowed: frozenset[int]) -> Cores:
    """The one CPU of ``allowed`` a duet on one CPU runs on, as :class:`Cores` of that CPU
    twice: CPU 0 only where it is the only one (the kernel serves most interrupts there)."""
    if not allowed:
        raise ValueError("no CPU to choose from")
    return Cores((cpu := min(allowed, key=lambda c: (c == 0, c)), cpu), siblings=False)


def host_cores(schedule: str = "duet") -> Cores:
    """:func:`choose_cores` of this process's CPUs (``os.sched_getaffinity(0)``) and the SMT
    siblings the kernel lists (``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list``);
    for ``schedule`` ``"duet-one-cpu"``, :func:`choose_cpu` of those CPUs."""
    allowed = frozenset(os.sched_getaffinity(0))
    if schedule == ONE_CPU:
        return choose_cpu(allowed)
    siblings = {}
    for cpu in allowed:
        try:
            siblings[cpu] = parse_cpu_list((SYS_CPU / f"cpu{cpu}/topology/thread_siblings_list").read_text())
        except (OSError, ValueError):  # no topology (a container hiding it): taken as a core of its own
            siblings[cpu] = frozenset({cpu})
    return choose_cores(allowed, siblings)


def pairs(schedule: list[Slot]) -> list[tuple[Slot, Slot]]:
    """The slots of an interleaved schedule as its pairs: each a control and a treatment."""
    if len(schedule) % 2:
        raise ValueError("a duet schedule has whole pairs")
    paired = list(zip(schedule[::2], schedule[1::2], strict=True))
    for a, b in paired:
        if {a.side, b.side} != {CONTROL, TREATMENT}:
            raise ValueError(f"slots {a.position} and {b.position} are not one pair")
    return paired


def measure_duet(runner, artifacts: Mapping[str, Path], workload, schedule: list[Slot], timeout_s: float,
                 on_invocation: Callable[[Slot, InvocationResult], None], cores: Cores,
                 into: Measurement | None = None) -> Measurement:
    """:func:`~abwatch.runners.harness.measure` with each pair's two invocations at once: the
    pair's first slot on ``cores.cpus[0]``, its second on ``cpus[1]`` (on one CPU, the same), started together (a
    barrier both pass just before their timed work). ``on_invocation`` is called in this thread,
    both of a pair in slot order, once both have ended; the first pair with a failure ends it.
    An interrupt (Ctrl-C) ends it once the running pair has (each process at its time limit at
    the latest): the processes are another thread's children, which that thread reaps."""
    result_of = into or Measurement({CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []},
                                    {CONTROL: [], TREATMENT: []})
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="abwatch-duet") as pool:
        for pair in pairs(schedule):
            barrier = threading.Barrier(2)

            def together(barrier: threading.Barrier = barrier) -> None:
                # broken: the other side failed before its start (this one runs alone, the pair fails)
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()

            def one(slot: Slot, cpu: int, barrier: threading.Barrier = barrier) -> InvocationResult:
                # once a side: a forked child run again on the compiler's library after the barrier
                # (runners/tvm_sessions.py) would otherwise wait for a side that has gone on
                once = functools.cache(together)
                try:
                    return runner.run(artifacts[slot.side], workload, timeout_s, slot.side,
                                      placement=Placement(frozenset({cpu}), once))
                finally:
                    # past the barrier this changes nothing; before it (a side that failed to
                    # start) it lets the other side go on instead of waiting for ever
                    barrier.abort()

            futures = [pool.submit(one, slot, cpu) for slot, cpu in zip(pair, cores.cpus, strict=True)]
            results = [f.result() for f in futures]
            failed = False
            for slot, result in zip(pair, results, strict=True):
                on_invocation(slot, result)  # both are stored, the failed one too
                failed = failed or not take(result_of, slot, result)
            if failed:
                break
    return result_of
