"""Where long work (builds, measurements, watch jobs) reports what it is doing.

The CLI draws it (``service.cli.report``); the watch logs it; tests may ignore it. A sink that
also has a ``stage(Stage)`` method (a pull request's job: ``service.watch.pulls``) is told of
each step others may show, as data: the run started, a side built, measuring started, a
workload measured (:func:`stage`); the others are not asked to have one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Progress(Protocol):
    """A sink for messages and per-invocation ticks."""

    def message(self, text: str) -> None: ...

    def invocation(self, workload: str, done: int, total: int) -> None: ...


class NullProgress:
    """Progress that shows nothing."""

    def message(self, text: str) -> None:
        """Ignore the message."""

    def invocation(self, workload: str, done: int, total: int) -> None:
        """Ignore the tick."""


RUN, BUILT, MEASURING, MEASURED = "run", "built", "measuring", "measured"


@dataclass(frozen=True)
class Stage:
    """One step of a run: ``kind`` is :data:`RUN` (``run_id``, ``what``: the run's type),
    :data:`BUILT` (``side``, ``sha``, ``what``: ``built in N s``, ``cached``, the reuse, or
    ``build FAILED: ...``), :data:`MEASURING` (``total`` workloads) or :data:`MEASURED`
    (``workload``, ``done`` of ``total``, ``what``: its verdict before the false-discovery
    adjustment, or why it was not judged)."""

    kind: str
    what: str = ""
    run_id: int | None = None
    side: str = ""
    sha: str = ""
    workload: str = ""
    done: int = 0
    total: int = 0


def stage(progress: Progress, event: Stage) -> None:
    """Tell ``progress`` of ``event`` when it takes stages (a ``stage`` method)."""
    hook = getattr(progress, "stage", None)
    if callable(hook):
        hook(event)
