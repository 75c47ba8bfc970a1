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
``run.counter`` (``auto``: perf where it works, else Valgrind).
"""

from __future__ import annotations

import abc
import functools
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar


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


class PerfCounter(InstructionCounter):
    """The hardware counter through ``perf stat`` (children included, user space only)."""

    name = "perf"
    EVENT = "instructions:u"

    @functools.cache  # noqa: B019 - one instance per process (COUNTERS); the answer does not change
    def unavailable(self) -> str | None:
        if shutil.which("perf") is None:
            return "perf is not installed (Debian: linux-perf)"
        try:
            proc = subprocess.run(["perf", "stat", "-x", ",", "-e", self.EVENT, "true"], capture_output=True,
                                  text=True, timeout=30)
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


COUNTERS: dict[str, InstructionCounter] = {
    PerfCounter.name: PerfCounter(),
    ValgrindCounter.name: ValgrindCounter(),
}


def choose(preference: str = "auto") -> InstructionCounter:
    """The counter ``run.counter`` names; ``auto``: perf where the kernel counts instructions,
    else Valgrind. CounterUnavailable says why none can be used."""
    names = list(COUNTERS) if preference == "auto" else [preference]
    reasons = []
    for name in names:
        counter = COUNTERS[name]
        why = counter.unavailable()
        if why is None:
            return counter
        reasons.append(f"{name}: {why}")
    raise CounterUnavailable("cannot count instructions here (" + "; ".join(reasons) + ")")
