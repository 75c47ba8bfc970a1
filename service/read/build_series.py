"""The builds' own series: a build configuration's ``binary_size`` per commit (``abwatch history
--metric binary-size``, ``GET /api/builds/series``).

A series is one (repository, builder, build configuration hash): what one config builds, commit
after commit. Each point is a successful build's sizes as kept on its row (``builds.metrics
["binary_size"]``, ``service.compare.building.measure_size``), ordered by commit time (releases,
which have none, in the order they were first built). The value is what a run judges
(``service.compare.metrics.BinarySize``): the libraries' ``.text`` bytes, or their file bytes
where they are no ELF files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.compare.outcome import DriverError
from abwatch.service.store.models import Build, BuildStatus, Commit, Repository

METRIC = "binary_size"


@dataclass(frozen=True)
class BuildPoint:
    """One commit's build: its libraries' sizes, and the value judged (``source`` says which)."""

    sha: str
    summary: str
    committed_at: datetime | None
    build_id: int
    value: int
    source: str  # "elf .text" or "file bytes"
    text_bytes: int | None
    file_bytes: int
    files: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildSeries:
    """One build configuration's points, oldest commit first."""

    repository: str
    builder: str
    config_hash: str
    points: list[BuildPoint]


def series(session: Session, builder: str | None = None, config_hash: str | None = None) -> list[BuildSeries]:
    """Every build configuration's series (only ``builder``'s, only configurations whose hash
    starts with ``config_hash``), the most recently built first. A commit built more than once
    by one configuration (another toolchain's cache key) is its newest build."""
    query = (select(Build, Commit, Repository.url).join(Commit, Commit.id == Build.commit_id)
             .join(Repository, Repository.id == Commit.repository_id)
             .where(Build.status == BuildStatus.SUCCESS).order_by(Build.id))
    if builder is not None:
        query = query.where(Build.builder == builder)
    if config_hash:
        query = query.where(Build.config_hash.startswith(config_hash, autoescape=True))
    grouped: dict[tuple[str, str, str], dict[str, tuple[int, BuildPoint]]] = {}
    for build, commit, url in session.execute(query):
        sizes = (build.metrics or {}).get(METRIC)
        if not isinstance(sizes, dict):
            continue  # built before sizes were kept, or its builder names no libraries
        on_text = sizes.get("text_bytes") is not None
        point = BuildPoint(commit.sha, commit.summary, commit.committed_at, build.id,
                           int(sizes["text_bytes"] if on_text else sizes["file_bytes"]),
                           "elf .text" if on_text else "file bytes", sizes.get("text_bytes"),
                           int(sizes["file_bytes"]), dict(sizes.get("files") or {}))
        points = grouped.setdefault((url, build.builder, build.config_hash), {})
        first = points.get(commit.sha, (build.id, point))[0]  # where the commit first came: its place in the order
        points[commit.sha] = (first, point)
    found = [BuildSeries(url, kind, config, [p for _, p in sorted(
        points.values(), key=lambda fp: (fp[1].committed_at is None, fp[1].committed_at or datetime.min, fp[0]))])
        for (url, kind, config), points in grouped.items()]
    return sorted(found, key=lambda s: -max(p.build_id for p in s.points))


def found(session: Session, builder: str | None = None, config_hash: str | None = None) -> list[BuildSeries]:
    """:func:`series`, or an error saying there is none."""
    result = series(session, builder, config_hash)
    if not result:
        raise DriverError("no build's binary size is stored" + (f" for builder {builder!r}" if builder else "")
                          + (f" with a config hash {config_hash!r}..." if config_hash else "")
                          + " (kept for builds whose builder names their libraries)")
    return result


def series_json(found: list[BuildSeries]) -> dict:
    """The ``--json`` shape of ``abwatch history --metric binary-size`` and of ``GET /api/builds/series``."""
    return {"metric": METRIC, "unit": "bytes", "series": [
        {"repository": s.repository, "builder": s.builder, "config_hash": s.config_hash,
         "points": [{"sha": p.sha, "summary": p.summary, "build_id": p.build_id,
                     "committed_at": p.committed_at.isoformat() if p.committed_at else None,
                     "value": p.value, "source": p.source, "text_bytes": p.text_bytes, "file_bytes": p.file_bytes,
                     "files": p.files} for p in s.points]} for s in found]}
