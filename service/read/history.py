"""History: one value per commit for a workload, and the commits where it stepped.

"When did resnet-18 on this board get slower, and which commit did it?" The series is
built from the records abwatch's own runs stored (each carries the commit sha as
``engine_version`` and the median as ``metrics.runtime_ms_median``), ordered by commit
time; :func:`service.stats.change_points` finds the steps.
"""

from __future__ import annotations

import difflib
import graphlib
import itertools
import statistics as pystats
from dataclasses import dataclass
from datetime import datetime

from pathlib import Path

import git
from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from abwatch.core.metric_names import OF_WORKLOADS, Metric, series_name
from abwatch.core.errors import UsageError
from abwatch.core.device_identity import summary
from abwatch.service import stats
from abwatch.service.compare.metrics import METRICS as REGISTRY
from abwatch.service.stats.verdict import RegressionKind
from abwatch.service.store.models import Commit, Comparison, Device, MetricMeasurement, Record, Run, Workload
from abwatch.builders.repo import RepoError, RepoMirror


@dataclass(frozen=True)
class Point:
    """The workload's time at one commit: per run, each process's fastest sample and their
    median (a plain median for runs recorded before that was kept); the median over the runs."""

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


def series_of(session: Session, workload: str) -> list[Workload]:
    """The series named ``workload`` (one per repository and spec), the most recently measured first."""
    newest = func.max(Comparison.run_id)
    rows = session.execute(
        select(Workload, newest).join(Comparison, Comparison.workload_id == Workload.id)
        .where(Workload.name == workload).group_by(Workload.id).order_by(newest.desc())).all()
    return [row for row, _ in rows]


def unknown_workload(session: Session, workload: str) -> str:
    """What to say of a workload nothing measured: the nearest measured name, and every one
    (``""`` when ``workload`` has been measured)."""
    names = sorted(set(session.scalars(select(Workload.name).join(Comparison, Comparison.workload_id == Workload.id))))
    if workload in names:
        return ""
    close = difflib.get_close_matches(workload, names, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"; {guess}measured workloads: {', '.join(names) or 'none yet'}"


def devices_of(session: Session, workload: str, series_id: int | None = None,
               name: str | None = None) -> list[Device]:
    """The device rows (one per name and fingerprint) whose runs measured ``workload`` (of series
    ``series_id``; on device ``name``), the most recently measured first."""
    newest = func.max(Comparison.run_id)
    query = (select(Device, newest).join(Run, Run.device_id == Device.id).join(Comparison, Comparison.run_id == Run.id)
             .join(Workload, Workload.id == Comparison.workload_id).where(Workload.name == workload))
    if series_id is not None:
        query = query.where(Comparison.workload_id == series_id)
    if name is not None:
        query = query.where(Device.name == name)
    return [row for row, _ in session.execute(query.group_by(Device.id).order_by(newest.desc())).all()]


def pick_device(session: Session, workload: str, series_id: int | None, name: str | None,
                fingerprint: str | None = None) -> tuple[int | None, str | None]:
    """(device row, what to tell the reader) of a history: with a device ``name``, one of its
    fingerprints (``fingerprint``, a prefix of its hash; else the newest measured), never several
    mixed; without one, every device (None), said when several devices or fingerprints measured it.
    Raises UsageError for a fingerprint that names none (or several) of the device's."""
    rows = devices_of(session, workload, series_id, name)
    listing = "; ".join(f"{d.name} {d.fingerprint_hash[:12] or '(none)'}: {summary(d.fingerprint or {})}" for d in rows)
    if fingerprint:
        picked = [d for d in rows if d.fingerprint_hash.startswith(fingerprint)]
        if len(picked) != 1:
            raise UsageError(f"fingerprint {fingerprint!r} names {len(picked)} of the fingerprints that measured "
                              f"{workload!r}: {listing or 'none'}")
        return picked[0].id, None
    if name is None:
        return None, (f"{workload}: measured on {len(rows)} devices or fingerprints, mixed in this history; keep one "
                      f"with --device (and --fingerprint): {listing}" if len(rows) > 1 else None)
    if not rows:
        return None, None
    return rows[0].id, (f"{workload} on {name}: {len(rows)} fingerprints (its hardware, kernel, driver or target "
                        f"changed), each a series; showing the newest measured, {rows[0].fingerprint_hash[:12]}; choose "
                        f"with --fingerprint: {listing}" if len(rows) > 1 else None)


# What a series may follow (``abwatch history --metric``): every metric of the registry, of the
# run or (``compile-``) of the compile. Time is read from the v0.1 records (the first field
# present wins); the others from the rows of ``measurements`` (each side's values, one per
# process; a workload measured on instructions alone writes no record, whose schema requires a
# run time).
RECORDED = {"time": ("runtime_ms_fastest", "runtime_ms_median"), "compile-time": ("compilation_ms",)}
MEASURED = {series_name(metric, phase.value): (metric, phase)
            for phase in (RegressionKind.RUNTIME, RegressionKind.COMPILE_TIME) for metric in OF_WORKLOADS
            if metric is not Metric.TIME}
# a workload's series (the builds' own, binary-size, are service.read.build_series)
UNITS = {series_name(kind.metric, phase): kind.unit for kind in REGISTRY.values() if kind.metric in OF_WORKLOADS
         for phase in ("runtime", "compile-time")}
assert set(UNITS) == set(RECORDED) | set(MEASURED)


def _measured(session: Session, workload: str, hardware: str | None, series_id: int | None,
              metric: str, device_id: int | None = None) -> dict[tuple[int, str], list[float]]:
    """Each side's median value per (repository, sha), from the ``measurements`` rows of ``metric``."""
    name, phase = MEASURED[metric]
    query = (select(MetricMeasurement, Run).join(Comparison, Comparison.id == MetricMeasurement.comparison_id)
             .join(Run, Run.id == Comparison.run_id).join(Workload, Workload.id == Comparison.workload_id)
             .where(Workload.name == workload, MetricMeasurement.metric == name, MetricMeasurement.phase == phase))
    if series_id is not None:
        query = query.where(Comparison.workload_id == series_id)
    if device_id is not None:
        query = query.where(Run.device_id == device_id)
    by_sha: dict[tuple[int, str], list[float]] = {}
    for row, run in session.execute(query):
        if hardware is not None and (run.device is None or run.device.name != hardware):
            continue
        for values, commit in ((row.control_values, run.control_commit), (row.treatment_values, run.treatment_commit)):
            if values:
                by_sha.setdefault((run.repository_id, commit.sha), []).append(float(pystats.median(values)))
    return by_sha


def series(session: Session, workload: str, hardware: str | None = None,
           series_id: int | None = None, metric: str = "time", device_id: int | None = None) -> list[Point]:
    """The per-commit medians of ``workload`` (optionally on one device), oldest commit first,
    on ``metric`` (a key of :data:`UNITS`; its values are in ``Point.median_ms`` whatever the unit).

    ``series_id`` (a workload row, see :func:`series_of`) keeps only the runs that measured
    that series: one repository, one spec; ``device_id`` (a device row, see :func:`devices_of`)
    only the runs on that fingerprint of a device. Commits are looked up in the repository of
    the run that measured them, never by sha alone.
    """
    by_sha = (_measured(session, workload, hardware, series_id, metric, device_id) if metric in MEASURED
              else _recorded(session, workload, hardware, series_id, metric, device_id))
    if not by_sha:
        return []
    commits = {(c.repository_id, c.sha): c for c in session.scalars(
        select(Commit).where(Commit.sha.in_({sha for _, sha in by_sha}),
                             Commit.repository_id.in_({r for r, _ in by_sha})))}
    points = [
        Point(sha, commits[key].summary if key in commits else "",
              commits[key].committed_at if key in commits else None,
              pystats.median(values), len(values))
        for key, values in by_sha.items() for sha in [key[1]]
    ]
    return _in_commit_order(session, points)


def _in_commit_order(session: Session, points: list[Point]) -> list[Point]:
    """``points`` by commit time. Commits of the same second (a rebased stack, a scripted
    history) are ordered by the runs that compared them: a run's control comes before its
    treatment; what no run relates keeps the sha order, so the result is stable."""
    by_time = sorted(points, key=lambda p: (p.committed_at is None, p.committed_at or datetime.min, p.sha))
    shas = {p.sha for p in points}
    control, treatment = aliased(Commit), aliased(Commit)
    before: dict[str, set[str]] = {}
    for older, newer in session.execute(
            select(control.sha, treatment.sha).join(Run, Run.control_commit_id == control.id)
            .join(treatment, Run.treatment_commit_id == treatment.id)
            .where(control.sha.in_(shas), treatment.sha.in_(shas)).distinct()):
        before.setdefault(newer, set()).add(older)
    ordered: list[Point] = []
    for _, group in itertools.groupby(by_time, key=lambda p: p.committed_at):
        tied = list(group)
        # by position: one sha may stand twice (the same commit in two repositories)
        graph = {i: {j for j, q in enumerate(tied) if q.sha in before.get(p.sha, ())} for i, p in enumerate(tied)}
        try:
            sorter = graphlib.TopologicalSorter(graph)
            sorter.prepare()
        except graphlib.CycleError:  # runs that compared both ways round: time and sha decide
            ordered.extend(tied)
            continue
        while sorter.is_active():  # of the commits ready together, the sha order first
            ready = sorted(sorter.get_ready())
            ordered.extend(tied[i] for i in ready)
            sorter.done(*ready)
    return ordered


def _recorded(session: Session, workload: str, hardware: str | None, series_id: int | None,
              metric: str, device_id: int | None = None) -> dict[tuple[int, str], list[float]]:
    """Each record's ``metric`` per (repository, sha)."""
    query = (select(Record, Run.repository_id).join(Run, Run.id == Record.run_id)
             .where(Record.workload == workload))
    if series_id is not None:
        query = query.where(Record.run_id.in_(select(Comparison.run_id).where(Comparison.workload_id == series_id)))
    if hardware is not None:
        query = query.where(Record.hardware == hardware)
    if device_id is not None:
        query = query.where(Run.device_id == device_id)
    by_sha: dict[tuple[int, str], list[float]] = {}
    for record, repository_id in session.execute(query):
        metrics = record.fields.get("metrics", {})
        # time: the verdict's scale (each process's fastest sample, their median) where the run kept it
        median = next((metrics[k] for k in RECORDED[metric] if metrics.get(k) is not None), None)
        if record.engine_version and isinstance(median, (int, float)):
            by_sha.setdefault((repository_id, record.engine_version), []).append(float(median))
    return by_sha


def first_parent_line(session: Session, workload: str, series_id: int | None = None) -> tuple[str, set[str]] | None:
    """(branch, shas) of the configured branch's first-parent line, as of the newest run that
    measured ``workload`` (of series ``series_id``, if given); None where there is no git
    history (release builds) or no mirror."""
    query = select(Run).join(Record, Record.run_id == Run.id).where(Record.workload == workload)
    if series_id is not None:
        query = query.where(Run.id.in_(select(Comparison.run_id).where(Comparison.workload_id == series_id)))
    run = session.scalar(query.order_by(Run.id.desc()).limit(1))
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
