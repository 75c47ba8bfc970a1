"""Load beside a benchmark: busy loops, as the project's load tests use them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes of ``python3 -c "while 1: pass"`` for the block's duration, killed after
    it (none for 0). Started from this process, so they share its session: the scheduler then
    shares the CPUs with them thread by thread, the heaviest contention this host can give."""
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
