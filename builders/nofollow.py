"""Files abwatch reads and writes in trees that code under test may also write.

A build's workspace belongs to the sandbox's user: the build may have put a link where
abwatch expects a file or a directory (``build/config.cmake -> /etc/passwd``). abwatch,
running as root, must then neither read a secret through it nor write through it, so it
walks such paths from a directory it trusts with ``O_NOFOLLOW`` at every step.

This module imports nothing from abwatch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parent(base: Path, parts: tuple[str, ...]) -> int:
    fd = os.open(base, os.O_RDONLY | _FLAGS | os.O_DIRECTORY)
    try:
        for part in parts:
            next_fd = os.open(part, os.O_RDONLY | _FLAGS | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes_inside(base: Path, relative: str, limit: int = 2**20) -> bytes | None:
    """The bytes of ``base/relative`` (at most ``limit``; ``None`` if it is not there), read
    without following a link anywhere below ``base``: code under test may have written that
    tree, and a link to a secret must not be read by abwatch. Anything but a regular file
    raises ``OSError``."""
    parts = Path(relative).parts
    try:
        fd = _open_parent(base, parts[:-1])
    except FileNotFoundError:
        return None
    try:
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=fd)  # a FIFO must not block
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise OSError(errno.EINVAL, "not a regular file", str(base / relative))
    with os.fdopen(file_fd, "rb") as handle:
        return handle.read(limit)


def read_inside(base: Path, relative: str, limit: int = 2**20) -> str | None:
    """:func:`read_bytes_inside` as text (invalid UTF-8 replaced)."""
    data = read_bytes_inside(base, relative, limit)
    return None if data is None else data.decode("utf-8", "replace")


def list_inside(base: Path, relative: str) -> list[str]:
    """The names in the directory ``base/relative`` (none if it is not there), reached without
    following a link."""
    try:
        fd = _open_parent(base, Path(relative).parts)
    except FileNotFoundError:
        return []
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def write_inside(base: Path, relative: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``base/relative`` (a link there is replaced, never written through;
    its directories must exist and be directories, not links)."""
    parts = Path(relative).parts
    fd = _open_parent(base, parts[:-1])
    try:
        with contextlib.suppress(FileNotFoundError):  # a link, or a file another user owns: gone
            os.unlink(parts[-1], dir_fd=fd)
        file_fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, mode, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "w") as handle:
        handle.write(text)
