"""The bookkeeping of timed fork servers started ahead (runners/fork_servers.py, TimedServers):
which server serves which child, when a successor starts, and that none is left running.

The servers here are stand-ins (objects that count their children and say when they are
closed), not TVM processes: what is under test is the pool's order and its cleanup, fast.
tests/test_forked_workers.py runs the same pool with real TVM servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from abwatch.runners.fork_servers import TimedServers
from abwatch.runners.worker_process import WorkerError


class StandIn:
    """A server's stand-in: its index, its children, whether it was closed."""

    def __init__(self, index: int) -> None:
        self.index, self.children, self.closed = index, 0, False

    def close(self) -> None:
        self.closed = True


class Pool(TimedServers):
    """TimedServers whose servers are stand-ins; ``fail``: the indices whose start fails."""

    def __init__(self, children: int, prestart: bool, fail: frozenset[int] = frozenset()) -> None:
        super().__init__(children, prestart=prestart)
        self.made: list[StandIn] = []
        self.fail = fail

    def _start(self, artifact, env, sandbox, timeout_s):  # type: ignore[override]
        with self._lock:
            index, self.started = self.started, self.started + 1
        if index in self.fail:
            raise WorkerError(f"server {index} failed to start")
        server = StandIn(index)
        self.made.append(server)
        return server


def serve(pool: Pool, side: str = "control", artifact: str = "a") -> int:
    with pool.one(side, Path(artifact), {}, None, 1.0) as server:  # type: ignore[arg-type]
        return server.index


def test_a_servers_successor_starts_at_its_first_child_and_serves_after_it():
    pool = Pool(2, prestart=True)
    assert serve(pool) == 0
    (ahead,) = pool.successors.values()  # started when server 0 took its first child
    assert ahead.result(timeout=10).index == 1 and ahead.result().children == 0
    assert [serve(pool) for _ in range(4)] == [0, 1, 1, 2]
    assert pool.made[0].closed and pool.made[1].closed and not pool.made[2].closed
    pool.close()
    assert all(s.closed for s in pool.made) and not pool.live and not pool.successors


def test_without_prestart_no_successor_starts_and_the_order_is_the_same():
    pool = Pool(2, prestart=False)
    assert [serve(pool) for _ in range(5)] == [0, 0, 1, 1, 2]
    assert not pool.successors and len(pool.made) == 3
    pool.close()


def test_successors_of_servers_no_run_takes_again_are_closed_beyond_keep():
    pool = Pool(1, prestart=True)  # one child a server: each server closes after its child
    for build in range(TimedServers.KEEP + 3):
        serve(pool, artifact=f"build-{build}")
    assert len(pool.successors) == TimedServers.KEEP
    kept = {f.result(timeout=10).index for f in pool.successors.values()}
    for future in list(pool.successors.values()):
        future.result(timeout=10)
    pool.close()
    assert all(s.closed for s in pool.made), [s.index for s in pool.made if not s.closed]
    assert len(kept) == TimedServers.KEEP


def test_a_successor_that_failed_to_start_fails_the_child_that_needed_it_and_the_next_starts_anew():
    pool = Pool(1, prestart=True, fail=frozenset({1}))
    assert serve(pool) == 0  # its successor (1) fails to start, in the background
    with pytest.raises(WorkerError, match="server 1 failed to start"):
        serve(pool)
    assert serve(pool) == 2  # started when asked for; its own successor (3) ahead
    pool.close()
    assert all(s.closed for s in pool.made)
