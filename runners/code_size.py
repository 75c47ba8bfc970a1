"""The size of what a compile produced: a compiled library's code (its ``.text`` section) and
its bytes on disk, read by ``builders.sizes`` (the reader a build's own libraries share).
Deterministic: the same compile gives the same sizes, so one library a side is the measurement
(``service.compare.metrics.CodeSize``)."""

from __future__ import annotations

from pathlib import Path

from abwatch.builders.sizes import FileSize as CodeSize, file_size


def measure(path: Path) -> CodeSize | None:
    """The sizes of the library at ``path``; None where there is none."""
    return file_size(path)
