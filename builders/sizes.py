"""Sizes of built files: a file's bytes on disk and its code (the ``.text`` section of an ELF
file, read with pyelftools). Deterministic: the same file always gives the same sizes.

``runners.code_size`` reads a compiled workload library through :func:`file_size`; a build's
own libraries (the ``binary_size`` metric: which files, each builder says,
:meth:`builders.builder.Builder.binary_files`) through :func:`binary_size`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile


class FileSize(TypedDict):
    """A file's sizes: ``text_bytes`` (None where it is no ELF file, e.g. a macOS or Windows
    library, or has no ``.text``) and ``file_bytes``."""

    text_bytes: int | None
    file_bytes: int


class BinarySize(TypedDict):
    """A build's libraries (stored as ``builds.metrics["binary_size"]``): each file's sizes by
    its path in the artifact, and their sums (``text_bytes`` over the files that have one, None
    where none has)."""

    files: dict[str, FileSize]
    text_bytes: int | None
    file_bytes: int


def file_size(path: Path) -> FileSize | None:
    """The sizes of the file at ``path``; None where there is none."""
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
    return FileSize(text_bytes=text, file_bytes=size)


def binary_size(root: Path, files: list[Path]) -> BinarySize | None:
    """The sizes of ``files`` (in the artifact ``root``) and their sums; None without any file."""
    found = {str(f.relative_to(root)): size for f in sorted(set(files))
             if f.is_file() and not f.is_symlink() and (size := file_size(f)) is not None}
    if not found:
        return None
    texts = [s["text_bytes"] for s in found.values() if s["text_bytes"] is not None]
    return BinarySize(files=found, text_bytes=sum(texts) if texts else None,
                      file_bytes=sum(s["file_bytes"] for s in found.values()))
