"""Where long work (builds, measurements, watch jobs) reports what it is doing.

The CLI draws it (``service.cli.report``); the watch logs it; tests may ignore it.
"""

from __future__ import annotations

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
