"""Load beside a benchmark: busy loops, as the project's load tests use them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_loops(count: int, own_sessions: bool = False) -> Iterator[None]:
    """``count`` processes of ``python3 -c "while 1: pass"`` for the block's duration, killed after
    it (none for 0). By default they share this process's session, as loops started from one
    shell do. Linux's autogroup (``/proc/sys/kernel/sched_autogroup_enabled``) shares the CPUs
    between sessions first: a measured worker, which runs in a session of its own, then weighs
    as much as all the loops together. ``own_sessions`` starts each loop in a session of its own,
    as independent jobs on a shared host are: each then weighs as much as a worker, the heavier
    load (te:matmul's forked pairs a minute beside six loops: 272 in one session, 104 in six)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], start_new_session=own_sessions)
             for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
