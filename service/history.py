"""History: one value per commit for a workload, and the commits where it stepped.

"When did resnet-18 on this board get slower, and which commit did it?" The series is
built from the records abwatch's own runs stored (each carries the commit sha as
``engine_version`` and the median as ``metrics.runtime_ms_median``), ordered by commit
time; :func:`service.stats.change_points` finds the steps.
"""

from __future__ import annotations

import statistics as pystats
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import stats
from service.models import Commit, Record


@dataclass(frozen=True)
class Point:
    """The workload's median time at one commit (median over every run that measured it)."""

    sha: str
    summary: str
    committed_at: datetime | None
    median_ms: float
    runs: int


@dataclass(frozen=True)
class Step:
    """A step change and the commit range it starts in."""

    last_before: Point
    first_after: Point
    change_pct: float
    p_value: float


def series(session: Session, workload: str, hardware: str | None = None) -> list[Point]:
    """The per-commit medians of ``workload`` (optionally on one device), oldest commit first."""
    query = select(Record).where(Record.workload == workload, Record.run_id.is_not(None))
    if hardware is not None:
        query = query.where(Record.hardware == hardware)
    by_sha: dict[str, list[float]] = {}
    for record in session.scalars(query):
        median = record.fields.get("metrics", {}).get("runtime_ms_median")
        if record.engine_version and isinstance(median, (int, float)):
            by_sha.setdefault(record.engine_version, []).append(float(median))
    if not by_sha:
        return []
    commits = {c.sha: c for c in session.scalars(select(Commit).where(Commit.sha.in_(by_sha)))}
    points = [
        Point(sha, commits[sha].summary if sha in commits else "",
              commits[sha].committed_at if sha in commits else None,
              pystats.median(values), len(values))
        for sha, values in by_sha.items()
    ]
    # commit time orders the history; ties (same second) keep the sha order stable
    return sorted(points, key=lambda p: (p.committed_at is None, p.committed_at or datetime.min, p.sha))


def steps(points: list[Point], **options) -> list[Step]:
    """The step changes of a series and the commit ranges they start in."""
    found = stats.change_points([p.median_ms for p in points], **options)
    return [Step(points[c.index - 1], points[c.index], c.change_pct, c.p_value) for c in found]
