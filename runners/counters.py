"""Instruction counters: how a process's retired instructions are counted, registered by name in
:data:`COUNTERS` (as builders are in ``BUILDERS`` and runners in ``RUNNERS``).

Wall time cannot decide a 0.5 % change on a shared host; the count of instructions a process
retires barely moves with load. Two sources:

* ``perf``: the kernel's hardware counter (``perf stat -e instructions:u``), user-space
  instructions of the process and its children, at native speed, where the kernel exposes it
  (most bare-metal hosts; not most VMs and containers);
* ``valgrind``: Valgrind's cachegrind counting every instruction it runs (``Ir``), anywhere,
  about 20-50x slower; children are followed and their counts added.

A counter wraps a command (an argument list, never a shell string) and reads the count back
from the files it wrote into a scratch directory. :func:`choose` picks one for a config's
``run.counter`` (``auto``: perf where it works, else Valgrind), which the config validates by
:func:`counter_name` against the registry.

A TVM worker counts a *region* of itself instead (the compile call, or the timed calls), so
that interpreter start-up and ``import tvm`` (4 G instructions, varying by ~0.1 % between
processes) do not drown a compile of 80 M. :meth:`InstructionCounter.region_spec` says how
the worker marks the region (``runners/worker/region.py``, ``Region``) and
:meth:`InstructionCounter.read_region` turns what it reported into a count:

* perf: the worker opens the hardware counter itself (``perf_event_open``, user space,
  inherited by threads it starts) and reads it before and after;
* Valgrind 3.19 has no client request to start and stop cachegrind's counting (callgrind's
  has, but it ran a TE matmul's compiling process 12x slower than cachegrind here: 437 s
  against 37 s), so the worker
  forks a child that exits at once before the region and another after it: a forked child
  inherits its parent's counts, so the second child's count minus the first's is the
  region's, to the instruction, whatever start-up cost.

Valgrind also says which functions the instructions were spent in (cachegrind's per-function
counts, C++ names demangled): :meth:`InstructionCounter.profile` and ``region_profile`` read them
(``runners/profiles.py``) before the scratch directory is cleaned. perf counts the total only
(per-function counts would need ``perf record``'s sampling, which is not a count).
"""

from __future__ import annotations

import abc
import functools
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

from abwatch.core.plugins import Registry
from abwatch.builders.sandbox import Sandbox
from abwatch.runners import profiles
from abwatch.runners.profiles import Profile, ProfileError


# Fixed in every counted process unless the workload sets it: Python's string hashing is seeded
# per process, and a different seed walks dicts and sets in another order, so a Python
# program's count would vary between processes for no reason in the code.
COUNTED_ENV = {"PYTHONHASHSEED": "0"}


class CounterUnavailable(RuntimeError):
    """No instruction counter can be used here (the message says why and what to install)."""


class CountError(RuntimeError):
    """A counted process left no readable count."""


class InstructionCounter(abc.ABC):
    """Counts the user-space instructions one command retires."""

    name: ClassVar[str]

    @abc.abstractmethod
    def unavailable(self) -> str | None:
        """Why this counter cannot be used here, or None when it can."""

    @abc.abstractmethod
    def wrap(self, argv: list[str], scratch: Path) -> list[str]:
        """``argv`` run under this counter, writing what it counted into ``scratch`` (an empty directory)."""

    @abc.abstractmethod
    def read(self, scratch: Path) -> int:
        """The instructions counted by the wrapped command's run (CountError if none were written)."""

    @abc.abstractmethod
    def region_argv(self, argv: list[str], scratch: Path) -> list[str]:
        """``argv`` (a process that counts a region of itself) run as this counter needs."""

    @abc.abstractmethod
    def read_region(self, scratch: Path, reported: dict) -> int:
        """The instructions of the region a worker reported (``reported``: what its ``_Region``
        said) once its process has exited (CountError if they cannot be read)."""

    def profile(self, scratch: Path) -> Profile | None:
        """Which functions the wrapped command's processes spent their instructions in
        (:mod:`abwatch.runners.profiles`); None where this counter counts no functions or its
        files cannot be read as a profile (the count itself stands)."""
        return None

    def region_profile(self, scratch: Path, reported: dict) -> Profile | None:
        """Which functions the region a worker reported spent its instructions in; None as for
        :meth:`profile`."""
        return None


class PerfCounter(InstructionCounter):
    """The hardware counter through ``perf stat`` (children included, user space only)."""

    name = "perf"
    EVENT = "instructions:u"

    @functools.cache  # noqa: B019 - one instance per process (COUNTERS); the answer does not change
    def unavailable(self) -> str | None:
        if shutil.which("perf") is None:
            return "perf is not installed (Debian: linux-perf)"
        try:
            # where counted processes run: in the sandbox (a user namespace may count less than the host)
            argv = Sandbox().wrap(["perf", "stat", "-x", ",", "-e", self.EVENT, "true"], None, None)
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"perf stat did not run: {exc}"
        try:
            self._parse(proc.stderr)
        except CountError as exc:
            return f"perf stat cannot count {self.EVENT} here: {exc}"
        return None

    def wrap(self, argv: list[str], scratch: Path) -> list[str]:
        return ["perf", "stat", "-x", ",", "-e", self.EVENT, "-o", str(scratch / "perf.csv"), "--", *argv]

    def read(self, scratch: Path) -> int:
        try:
            return self._parse((scratch / "perf.csv").read_text())
        except OSError as exc:
            raise CountError(f"perf wrote no count: {exc}") from None

    def region_argv(self, argv: list[str], scratch: Path) -> list[str]:
        return argv  # the worker opens the counter itself

    def read_region(self, scratch: Path, reported: dict) -> int:
        if not isinstance(reported.get("count"), int):
            raise CountError(f"the worker reported no perf count: {reported}")
        return reported["count"]

    @classmethod
    def _parse(cls, text: str) -> int:
        # CSV lines: value,unit,event,... ; "<not supported>" or "<not counted>" in place of a value
        for line in text.splitlines():
            fields = line.split(",")
            if len(fields) >= 3 and fields[2].startswith("instructions"):
                if not fields[0].strip().isdigit():
                    raise CountError(fields[0].strip() or "no value")
                return int(fields[0])
        raise CountError(f"no {cls.EVENT} line in perf's output")


class ValgrindCounter(InstructionCounter):
    """Valgrind's cachegrind with its cache simulation off: every instruction run, counted in
    software (children followed, one file each, summed)."""

    name = "valgrind"

    def unavailable(self) -> str | None:
        return None if shutil.which("valgrind") else "valgrind is not installed (Debian: valgrind)"

    def wrap(self, argv: list[str], scratch: Path) -> list[str]:
        return ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--branch-sim=no", "--trace-children=yes",
                f"--cachegrind-out-file={scratch}/cg.%p", f"--log-file={scratch}/valgrind.%p.log", "--", *argv]

    def region_argv(self, argv: list[str], scratch: Path) -> list[str]:
        return ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--branch-sim=no",
                f"--cachegrind-out-file={scratch}/cg.%p", f"--log-file={scratch}/valgrind.%p.log", "--", *argv]

    def read_region(self, scratch: Path, reported: dict) -> int:
        marks = reported.get("marks")
        if not (isinstance(marks, list) and len(marks) == 2 and all(isinstance(m, int) for m in marks)):
            raise CountError(f"the worker reported no region marks: {reported}")
        before, after = (self._summary(scratch / f"cg.{pid}") for pid in marks)
        if after < before:
            raise CountError(f"the region's end mark counted fewer instructions than its start ({after} < {before})")
        return after - before

    @staticmethod
    def _summary(path: Path) -> int:
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise CountError(f"valgrind wrote no count for a region mark: {exc}") from None
        for line in text.splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
        raise CountError(f"{path.name} has no summary line")

    def region_profile(self, scratch: Path, reported: dict) -> Profile | None:
        # the end mark's counts minus the start mark's, function by function
        marks = reported.get("marks")
        if not (isinstance(marks, list) and len(marks) == 2 and all(isinstance(m, int) for m in marks)):
            return None
        try:
            before, after = (profiles.read_cg(scratch / f"cg.{pid}") for pid in marks)
        except ProfileError:
            return None
        return profiles.top(profiles.subtract(after, before))

    def profile(self, scratch: Path) -> Profile | None:
        try:
            return profiles.top(profiles.add(profiles.read_cg(path) for path in sorted(scratch.glob("cg.*"))))
        except ProfileError:
            return None

    def read(self, scratch: Path) -> int:
        total, found = 0, 0
        for path in sorted(scratch.glob("cg.*")):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("summary:"):
                    total += int(line.split()[1])  # the first event, Ir
                    found += 1
        if not found:
            logs = " ".join(p.read_text(errors="replace")[-500:] for p in scratch.glob("valgrind.*.log"))
            raise CountError(f"valgrind wrote no count{': ' + logs.strip() if logs.strip() else ''}")
        return total


# name -> counter, in the order ``auto`` tries them; ``run.counter`` is validated by these names
# (``service.config.RunConfig``), so a counter registered here is one the config can name.
COUNTERS: Registry[InstructionCounter] = Registry("instruction counter", (
    (counter.name, counter) for counter in (PerfCounter(), ValgrindCounter())))

# what ``run.counter`` writes for "perf where the kernel counts instructions, else Valgrind"
AUTO = "auto"


def counter_name(value: str) -> str:
    """``value`` if it is ``auto`` or names a counter of :data:`COUNTERS`, else ValueError listing them."""
    if value != AUTO and value not in COUNTERS:
        raise ValueError(f"unknown instruction counter {value!r}; expected {AUTO!r} or one of "
                         f"{COUNTERS.expected()}{COUNTERS.hint(value)}")
    return value


def choose(preference: str = "auto") -> InstructionCounter:
    """The counter ``run.counter`` names; ``auto``: perf where the kernel counts instructions,
    else Valgrind. CounterUnavailable says why none can be used."""
    names = list(COUNTERS) if preference == AUTO else [preference]
    reasons = []
    for name in names:
        counter = COUNTERS[name]
        why = counter.unavailable()
        if why is None:
            return counter
        reasons.append(f"{name}: {why}")
    raise CounterUnavailable("cannot count instructions here (" + "; ".join(reasons) + ")")
