"""The size of what a compile produced: a compiled library's code (its ``.text`` section, read
with pyelftools) and its bytes on disk. Deterministic: the same compile gives the same sizes,
so one library a side is the measurement (``service.compare.metrics.CodeSize``)."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile


class CodeSize(TypedDict):
    """A compiled library's sizes: ``text_bytes`` (None where it is no ELF file, e.g. a
    macOS or Windows library) and ``file_bytes``."""

    text_bytes: int | None
    file_bytes: int


def measure(path: Path) -> CodeSize | None:
    """The sizes of the library at ``path``; None where there is none."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    try:
        with path.open("rb") as f:
            section = ELFFile(f).get_section_by_name(".text")
            text = None if section is None else int(section.header["sh_size"])
    except (OSError, ELFError, ValueError, KeyError, EOFError):  # the build wrote it: a damaged file is no size
        text = None
    return CodeSize(text_bytes=text, file_bytes=size)
