"""The one file lock: ``flock`` held on a file for a block (the artifact cache's entries, a
repository mirror, a build workspace, the service's singleton locks)."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator


@contextmanager
def flocked(path: Path, operation: int = fcntl.LOCK_EX) -> Iterator[bool]:
    """Hold ``flock(operation)`` on ``path`` for the block; yields whether it was taken.

    Only a non-blocking operation (``LOCK_NB``) can yield False: the lock was held elsewhere.
    """
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, operation)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
