"""Pruning raw samples: the ``samples`` rows of old runs that opened nothing.

Raw samples are most of a store (a two-year nightly history: 10 M of them, see docs/store.md);
once a run's verdicts are taken and nothing came of them, its samples are read only by its
page's per-process chart. :func:`plan` finds the runs finished before a cutoff that no
regression points at, :func:`prune` deletes their samples in bounded transactions. Kept:
the runs (``samples_pruned_at`` set), their comparisons (the verdicts, with medians and
counts), their invocations (each process's wall time, CPU time and status), regressions,
events and records. ``abwatch db prune`` and the ``[retention]`` policy of the watch call these.

A run counts as referenced, and keeps its samples, when a regression was opened by it (its
run or comparison), a regression event names it (verify runs, fix checks, notes), a
bisection step was decided by it, or it verifies a run that opened a regression.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import CompoundSelect, CursorResult, Select, Table, delete, func, select, text, union, update
from sqlalchemy.orm import Session

from abwatch.service.store.base import utcnow
from abwatch.service.store.jobs import BisectionStep
from abwatch.service.store.models import Comparison, Invocation, Regression, RegressionEvent, Run, RunStatus, Sample

BATCH_ROWS = 50_000  # samples deleted per transaction: a big prune never holds one huge transaction
ID_CHUNK = 10_000  # sample ids in one DELETE's IN list (SQLite takes at most 32 766 values)
GROUP_RUNS = 500  # runs per group at most: an IN list SQLite takes (its limit is 32 766 values)
PROGRESS_EVERY_S = 5.0  # a long prune says how far it is at most this often


@dataclass(frozen=True)
class PrunePlan:
    """What a prune with this cutoff deletes: the samples of each run, by run id."""

    cutoff: datetime
    samples_by_run: Mapping[int, int] = field(default_factory=dict)
    invocations: int = 0  # invocations of those runs: kept, their raw samples go
    kept_runs: int = 0  # runs finished before the cutoff whose samples stay (a regression points at them)
    bytes_estimate: int | None = None  # the samples' share of the samples table and its indexes (PostgreSQL)

    @property
    def runs(self) -> int:
        """How many runs lose their samples."""
        return len(self.samples_by_run)

    @property
    def samples(self) -> int:
        """How many sample rows go."""
        return sum(self.samples_by_run.values())


@dataclass(frozen=True)
class PruneResult:
    """What a prune deleted, and how long it took."""

    runs: int
    samples: int
    seconds: float


def referenced_runs() -> CompoundSelect:
    """The ids of runs a regression points at, one way or another (never NULL: a NULL in a
    ``NOT IN`` list would make it match nothing)."""
    verified = select(Run.id).where(Run.parent_run_id.in_(select(Regression.run_id)))
    return union(
        select(Regression.run_id),
        select(Comparison.run_id).where(Comparison.id.in_(select(Regression.comparison_id))),
        select(RegressionEvent.run_id).where(RegressionEvent.run_id.is_not(None)),
        select(BisectionStep.run_id).where(BisectionStep.run_id.is_not(None)),
        verified,
    )


def _old_runs(cutoff: datetime) -> Select:
    """Runs that ended before ``cutoff`` (a run still running never; one abandoned without an
    end time by its start)."""
    return select(Run.id).where(Run.status != RunStatus.RUNNING,
                                func.coalesce(Run.finished_at, Run.started_at) < cutoff)


def cutoff_of(days: float, now: datetime | None = None) -> datetime:
    """The instant ``days`` days before ``now`` (default: the present, UTC)."""
    if days <= 0:
        raise ValueError(f"--older-than must be more than 0 days, not {days:g}")
    return (now or utcnow()) - timedelta(days=days)


def plan(session: Session, cutoff: datetime) -> PrunePlan:
    """What a prune at ``cutoff`` would delete; reads only."""
    old = _old_runs(cutoff)
    candidates = old.where(Run.id.not_in(referenced_runs()))
    samples = {run_id: count for run_id, count in session.execute(
        select(Sample.run_id, func.count()).where(Sample.run_id.in_(candidates)).group_by(Sample.run_id))}
    ids = sorted(samples)
    invocations = sum(session.scalar(select(func.count()).select_from(Invocation).where(
        Invocation.run_id.in_(ids[i:i + GROUP_RUNS]))) or 0 for i in range(0, len(ids), GROUP_RUNS))
    kept = session.scalar(select(func.count()).select_from(old.where(Run.id.in_(referenced_runs())).subquery())) or 0
    return PrunePlan(cutoff, samples, invocations, kept, _bytes_estimate(session, sum(samples.values())))


def _bytes_estimate(session: Session, rows: int) -> int | None:
    """The share of the samples table (with its indexes) that ``rows`` rows take, on
    PostgreSQL from its size and row estimate (no scan); None on SQLite."""
    if session.get_bind().dialect.name != "postgresql" or rows == 0:
        return None if rows else 0
    total_bytes, estimate = session.execute(text(
        "SELECT pg_total_relation_size('samples'), reltuples FROM pg_class WHERE oid = 'samples'::regclass")).one()
    if estimate is None or estimate <= 0:  # never analysed: count them
        estimate = session.scalar(select(func.count()).select_from(Sample)) or 0
    return int(total_bytes * min(1.0, rows / estimate)) if estimate else None


def _groups(samples_by_run: Mapping[int, int], batch_rows: int) -> Iterator[list[int]]:
    """Run ids packed into groups of at most ``batch_rows`` samples (a bigger run alone) and
    :data:`GROUP_RUNS` runs."""
    group: list[int] = []
    size = 0
    for run_id in sorted(samples_by_run):
        count = samples_by_run[run_id]
        if group and (size + count > batch_rows or len(group) == GROUP_RUNS):
            yield group
            group, size = [], 0
        group.append(run_id)
        size += count
    if group:
        yield group


def prune(session: Session, found: PrunePlan, *, batch_rows: int = BATCH_ROWS,
          progress: Callable[[str], None] | None = None, stop: Callable[[], bool] | None = None) -> PruneResult:
    """Delete the samples ``found`` lists, committing every ``batch_rows`` samples at most.

    A group within ``batch_rows`` samples goes in one ``DELETE ... WHERE run_id IN``; a run
    bigger than that a batch of ids at a time. Each group's first transaction marks its runs
    (``samples_pruned_at``) with its first deletion, so a reader never sees a run without samples that does not say why; a run a
    regression came to point at since the plan keeps its samples. An interrupted prune leaves
    whole transactions done: the next one finds the runs that still have samples. ``stop``
    (a SIGTERM to the watch) ends it between two transactions.
    """
    t0 = last = time.perf_counter()
    runs = deleted = 0
    table = cast(Table, Sample.__table__)
    for group in _groups(found.samples_by_run, batch_rows):
        if stop is not None and stop():
            break
        group = list(session.scalars(select(Run.id).where(Run.id.in_(group), Run.id.not_in(referenced_runs()))))
        if not group:
            continue
        session.execute(update(Run).where(Run.id.in_(group), Run.samples_pruned_at.is_(None))
                        .values(samples_pruned_at=utcnow()))
        if sum(found.samples_by_run[r] for r in group) <= batch_rows:  # by ix_samples_run_id, one statement
            result = cast(CursorResult, session.execute(delete(table).where(table.c.run_id.in_(group))))
            deleted += result.rowcount
            session.commit()
        else:  # one run bigger than a batch: a batch of its ids at a time
            deleted += _delete_in_batches(session, table, group, batch_rows, stop)
        runs += len(group)
        if progress is not None and time.perf_counter() - last >= PROGRESS_EVERY_S:
            last = time.perf_counter()
            progress(f"pruned {deleted:,} of {found.samples:,} samples ({runs:,} of {found.runs:,} runs), "
                     f"{last - t0:.0f} s")
    return PruneResult(runs, deleted, time.perf_counter() - t0)


def _delete_in_batches(session: Session, table: Table, group: list[int], batch_rows: int,
                       stop: Callable[[], bool] | None) -> int:
    """Delete the samples of ``group`` ``batch_rows`` at a time, a transaction each. The ids are
    read first: PostgreSQL plans ``id IN (SELECT ... LIMIT n)`` as a scan of the whole table."""
    deleted = 0
    while True:
        ids = list(session.scalars(select(table.c.id).where(table.c.run_id.in_(group)).limit(batch_rows)))
        for i in range(0, len(ids), ID_CHUNK):
            chunk = ids[i:i + ID_CHUNK]
            deleted += cast(CursorResult, session.execute(delete(table).where(table.c.id.in_(chunk)))).rowcount
        session.commit()
        if len(ids) < batch_rows or (stop is not None and stop()):
            return deleted


def describe(found: PrunePlan) -> str:
    """What a plan deletes and keeps, in a sentence or two (``db prune``'s dry run)."""
    size = "" if found.bytes_estimate is None else f" (about {found.bytes_estimate / 2**20:,.1f} MiB of the samples table)"
    return (f"{found.runs:,} run(s) finished before {found.cutoff.isoformat(timespec='seconds')} that opened "
            f"nothing: {found.samples:,} raw sample(s) of {found.invocations:,} invocation(s){size}; "
            f"{found.kept_runs:,} older run(s) keep theirs (a regression points at them). "
            "The runs, their verdicts, invocations and records are kept.")
