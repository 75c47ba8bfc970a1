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

from pathlib import Path

import git
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service import stats
from abwatch.service.models import Commit, Record, Run
from abwatch.builders.repo import RepoError, RepoMirror


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


def first_parent_line(session: Session, workload: str) -> tuple[str, set[str]] | None:
    """(branch, shas) of the configured branch's first-parent line, as of the newest run that
    measured ``workload``; None where there is no git history (release builds) or no mirror."""
    run = session.scalar(
        select(Run).join(Record, Record.run_id == Run.id).where(Record.workload == workload)
        .order_by(Run.id.desc()).limit(1))
    if run is None:
        return None
    config = run.config or {}
    build, repo = config.get("build", {}), config.get("repo") or {}
    if build.get("kind") == "tvm-wheel" or not repo.get("url") or not config.get("cache_dir"):
        return None
    branch = repo.get("branch", "main")
    try:
        mirror = RepoMirror(repo["url"], Path(config["cache_dir"]))
        if not (mirror.path / "HEAD").exists():
            return None  # never fetched here: nothing to filter by, and no reason to clone now
        return branch, set(mirror.repo.git.rev_list("--first-parent", f"refs/heads/{branch}").split())
    except (RepoError, git.GitCommandError):
        return None


def on_line(points: list[Point], line: set[str]) -> list[Point]:
    """The points whose commit is on the line."""
    return [p for p in points if p.sha in line]


def steps(points: list[Point], **options) -> list[Step]:
    """The step changes of a series and the commit ranges they start in."""
    found = stats.change_points([p.median_ms for p in points], **options)
    return [Step(points[c.index - 1], points[c.index], c.change_pct, c.p_value) for c in found]
