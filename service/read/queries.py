"""Read-side queries shared by the REST API and the dashboard; every answer is plain JSON.

The run report is ``abwatch show --json``'s object (``service.read.stored`` + ``service.cli.report``),
plus what only a page needs: the per-process medians of both sides and the run's regressions.
"""

from __future__ import annotations

import statistics as pystats
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, joinedload

# stats resolves its functions on first use: NumPy and SciPy load only for the pages that draw a series
from abwatch.core.sides import Side
from abwatch.core.redact import mask_secrets
from abwatch.service import stats
from abwatch.service.read import serialize, stored
from abwatch.service.read.artifact_report import manifest_of
from abwatch.service.store.models import (
    AlertDelivery, Build, Commit, Comparison, Device, Job, Regression, Run, Sample, TriageEvent, WatchedCommit, WatchProgress,
    Workload,
)
from abwatch.service.stats.verdict import SILENCED_TRIAGE, Direction, Metric, RegressionKind, RegressionState

OPEN_STATES = (RegressionState.BENCHMARK, RegressionState.VERIFY, RegressionState.REGRESS)


class NotFound(LookupError):
    """The run, regression or workload asked for does not exist."""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# Loaded with the row in one query, not one query per row and relation.
RUN_LOADS = (joinedload(Run.control_commit), joinedload(Run.treatment_commit), joinedload(Run.device))
REGRESSION_LOADS = (joinedload(Regression.workload), joinedload(Regression.device),
                    joinedload(Regression.control_commit), joinedload(Regression.treatment_commit))


def run_summary(run: Run) -> dict[str, Any]:
    """One run as a list entry."""
    return {
        "id": run.id, "run_type": run.run_type.value, "status": run.status.value,
        "control_ref": run.control_ref, "treatment_ref": run.treatment_ref,
        "control_sha": run.control_commit.sha, "treatment_sha": run.treatment_commit.sha,
        "treatment_summary": run.treatment_commit.summary,
        "device": run.device.name if run.device else None, "parent_run_id": run.parent_run_id,
        "started_at": _iso(run.started_at), "finished_at": _iso(run.finished_at), "error": run.error,
        "samples_pruned_at": _iso(run.samples_pruned_at),
    }


def list_runs(session: Session, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
    """Runs, newest first, each with its verdict counts."""
    runs = list(session.scalars(select(Run).options(*RUN_LOADS).order_by(Run.id.desc())
                                .limit(limit).offset(offset)))
    counts: dict[int, dict[str, int]] = {}
    if runs:
        rows = session.execute(
            select(Comparison.run_id, Comparison.verdict, func.count())
            .where(Comparison.run_id.in_([r.id for r in runs]))
            .group_by(Comparison.run_id, Comparison.verdict))
        for run_id, verdict, count in rows:
            counts.setdefault(run_id, {})[verdict.value] = count
    return [{**run_summary(r), "verdicts": counts.get(r.id, {})} for r in runs]


def process_medians(session: Session, run_id: int) -> dict[str, dict[str, list[float]]]:
    """Per workload and side, the median of each measured (non-warm-up) process, in run order
    (empty for a run whose samples were pruned: ``samples_pruned_at`` says so)."""
    rows = session.execute(
        select(Workload.name, Sample.side, Sample.invocation_id, Sample.runtime_ms)
        .join(Workload, Workload.id == Sample.workload_id)
        .where(Sample.run_id == run_id, Sample.warmup.is_(False))
        .order_by(Sample.invocation_id, Sample.order_index))
    grouped: dict[str, dict[str, dict[int, list[float]]]] = {}
    for name, side, invocation, value in rows:
        grouped.setdefault(name, {}).setdefault(side.value, {}).setdefault(invocation, []).append(value)
    return {name: {side: [pystats.median(v) for v in by_inv.values()] for side, by_inv in sides.items()}
            for name, sides in grouped.items()}


def run_report(session: Session, run_id: int) -> dict[str, Any]:
    """One run's full A/B report: the ``abwatch show --json`` object (``service.cli.report``), plus
    the run's refs and times, each build's commit summary and duration, the per-process
    medians of both sides, and the run's regressions."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    data = serialize.outcome_json(stored.load_outcome(session, run_id))
    for build in data["builds"]:
        row = session.get(Build, build["build_id"])
        commit = run.control_commit if build["side"] == Side.CONTROL else run.treatment_commit
        build.update(summary=commit.summary, duration_s=row.duration_s if row else None,
                     compiler_cache=serialize.compiler_cache_json(row.metrics) if row else None)
    regressions = list(session.scalars(select(Regression).options(*REGRESSION_LOADS)
                                       .where(Regression.run_id == run_id).order_by(Regression.id)))
    return {
        **run_summary(run), **data, "seed": run.seed,
        "process_medians_ms": process_medians(session, run_id),
        "samples_note": serialize.pruned_note(run.samples_pruned_at) if run.samples_pruned_at else None,
        "regressions": [regression_summary(r) for r in regressions if r.direction is Direction.SLOWER],
        # confirmed or suspected improvements ([watch] bisect = [..., "improvement"]), never listed as regressions
        "improvements": [regression_summary(r) for r in regressions if r.direction is Direction.FASTER],
    }


def regression_summary(r: Regression) -> dict[str, Any]:
    """One regression as a list entry."""
    return {
        "id": r.id, "workload": r.workload.name, "workload_id": r.workload_id, "kind": RegressionKind(r.kind).value,
        "metric": Metric(r.metric or Metric.TIME).value, "state": r.state.value,
        "triage": r.triage.value if r.triage else None, "fixed_by": r.fixed_by,
        "silenced": r.triage in SILENCED_TRIAGE,
        "change_pct": r.change_pct, "run_id": r.run_id,
        "device": r.device.name if r.device else None, "device_id": r.device_id,
        "control_sha": r.control_commit.sha, "treatment_sha": r.treatment_commit.sha,
        "treatment_summary": r.treatment_commit.summary,
        "direction": Direction(r.direction or Direction.SLOWER).value,
        "fixed_by_commit": r.fixed_by_commit.sha if r.fixed_by_commit else None,
        "created_at": _iso(r.created_at), "updated_at": _iso(r.updated_at),
    }


def list_regressions(session: Session, *, state: str | None = None, workload: str | None = None,
                     device: str | None = None, since: datetime | None = None,
                     limit: int = 200) -> list[dict[str, Any]]:
    """Regressions, newest first, filtered by state, workload name, device name, opened since."""
    query = (select(Regression).options(*REGRESSION_LOADS).where(Regression.direction == Direction.SLOWER)
             .order_by(Regression.id.desc()).limit(limit))
    if state is not None:
        query = query.where(Regression.state == RegressionState(state))
    if workload is not None:
        query = query.join(Workload, Workload.id == Regression.workload_id).where(Workload.name == workload)
    if device is not None:
        query = query.join(Device, Device.id == Regression.device_id).where(Device.name == device)
    if since is not None:
        query = query.where(Regression.created_at >= since)
    return [regression_summary(r) for r in session.scalars(query)]


def regression_detail(session: Session, regression_id: int) -> dict[str, Any]:
    """One regression as ``abwatch regressions --json`` shows it (:func:`serialize.regression_json`:
    range, bisected culprit, bisection steps, state timeline, explanation), with its list fields, triage
    decisions and alert deliveries."""
    r = session.get(Regression, regression_id)
    if r is None:
        raise NotFound(f"regression {regression_id} does not exist")
    deliveries = session.scalars(select(AlertDelivery).where(AlertDelivery.regression_id == r.id)
                                 .order_by(AlertDelivery.id))
    return {
        # the CLI's shape: range, culprit (once bisected), steps, events, and the profile or operator
        # table that explains it
        **serialize.regression_json(session, r),
        **regression_summary(r),
        "control_summary": r.control_commit.summary,
        "triage_events": [triage_json(t) for t in r.triage_events],
        "alerts": [{"event": d.event, "webhook": d.webhook, "status": d.status.value, "attempts": d.attempts,
                    "status_code": d.status_code, "error": d.error, "at": _iso(d.at),
                    "delivered_at": _iso(d.delivered_at)} for d in deliveries],
    }


def triage_json(t: TriageEvent) -> dict[str, Any]:
    """A triage decision."""
    return {"status": t.status.value, "who": t.who, "issue_url": t.issue_url, "note": t.note, "at": _iso(t.at),
            "fixed_by": t.fixed_by}


def workloads(session: Session) -> list[dict[str, Any]]:
    """Every workload with the devices it has a series on."""
    rows = session.execute(text(
        "SELECT DISTINCT w.name, d.name FROM comparisons c JOIN runs r ON r.id = c.run_id "
        "JOIN workloads w ON w.id = c.workload_id LEFT JOIN devices d ON d.id = r.device_id"))
    out: dict[str, list[str]] = {name: [] for name in session.scalars(select(Workload.name).order_by(Workload.name))}
    for name, device in rows:
        if device is not None:
            out.setdefault(name, []).append(device)
    return [{"name": name, "devices": sorted(devices)} for name, devices in out.items()]


def series(session: Session, workload: str, device: str | None = None,
           max_pvalue: float = 0.001, change_points: bool = True) -> dict[str, Any]:
    """A workload's per-commit series on each device (the ``workload_series`` view), with its
    change points and the regressions found on it."""
    row = session.scalar(select(Workload).where(Workload.name == workload))
    if row is None:
        raise NotFound(f"workload {workload!r} does not exist")
    # by name: the view partitions by names, so PostgreSQL filters before its window
    params: dict[str, Any] = {"w": workload}
    where = "workload = :w"
    if device is not None:
        where += " AND device = :d"
        params["d"] = device
    points = session.execute(text(
        "SELECT device, sha, summary, committed_at, run_id, side, median_ms, fastest_ms, n, verdict, change_pct, "
        f"ci_low_pct, ci_high_pct, workload_id, repository, spec_hash, device_id FROM workload_series WHERE {where} "
        "ORDER BY device, device_id, workload_id, committed_at, measured_at"), params).mappings().all()
    regressions = list_regressions(session, workload=workload, device=device, limit=1000)
    fingerprints = dict(session.execute(select(Device.id, Device.fingerprint_hash).where(
        Device.id.in_({p["device_id"] for p in points if p["device_id"] is not None}))).all())
    # one entry per device *and* series: a name in two repositories, or with two specs, is two
    # series, and so is a device whose fingerprint (hardware, kernel, driver, target) changed
    devices: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for p in points:
        entry = devices.setdefault((p["device"] or "", p["device_id"], p["workload_id"]), {
            "device": p["device"], "device_id": p["device_id"], "fingerprint": fingerprints.get(p["device_id"]),
            "workload_id": p["workload_id"], "repository": p["repository"], "spec_hash": p["spec_hash"], "points": []})
        entry["points"].append({k: v for k, v in p.items()
                                if k not in ("workload_id", "repository", "spec_hash", "device_id")}
                               | {"committed_at": _as_iso(p["committed_at"]),
                                  # the figure plotted: on the verdict's scale where the run kept it
                                  "ms": p["fastest_ms"] if p["fastest_ms"] is not None else p["median_ms"]})
    note = None
    for entry in devices.values():
        values = [p["ms"] for p in entry["points"]]
        try:
            found = _change_points(values, max_pvalue) if change_points and len(values) >= 4 else []
        except ImportError as exc:  # Apache Otava is installed apart: the series stands without it
            found, note = [], str(exc)
        entry["change_points"] = [
            {"index": c.index, "sha": entry["points"][c.index]["sha"],
             "after_sha": entry["points"][c.index - 1]["sha"], "change_pct": c.change_pct, "p_value": c.p_value}
            for c in found]
        entry["regressions"] = [r for r in regressions if r["device"] == entry["device"]
                                and r.get("device_id") == entry["device_id"] and r["workload_id"] == entry["workload_id"]]
    return {"workload": workload, "devices": list(devices.values()), "note": note, "estimator": SERIES_ESTIMATOR}


SERIES_ESTIMATOR = ("ms: each process's fastest sample, the median across the run's processes of that commit "
                    "(the verdict's scale); runs measured before abwatch kept it show their plain median")


def _as_iso(value: Any) -> Any:
    # SQLite hands view columns back as text, PostgreSQL as datetimes
    return value.isoformat() if isinstance(value, datetime) else value


def overview(session: Session) -> dict[str, Any]:
    """What the dashboard's first page shows: the watched branches (``abwatch watch``), the
    repositories only compared (``compare``, try jobs), what is still open, the latest verdicts."""
    watched = [{
        "repository": row.repository.url, "branch": row.branch, "device": row.device,
        "last_tested": row.last_tested_sha, "last_tested_summary": _summary(session, row.last_tested_sha),
        "last_seen": row.last_seen_sha, "updated_at": _iso(row.updated_at),
    } for row in session.scalars(select(WatchProgress).order_by(WatchProgress.id))]
    compared = session.execute(text(
        "SELECT rp.url AS repository, r.id AS run_id, c.sha AS sha, c.summary AS summary, "
        "r.treatment_ref AS ref, r.finished_at AS finished_at "
        "FROM runs r JOIN repositories rp ON rp.id = r.repository_id JOIN commits c ON c.id = r.treatment_commit_id "
        "WHERE r.id IN (SELECT max(id) FROM runs WHERE status = 'completed' GROUP BY repository_id) "
        "ORDER BY rp.url")).mappings().all()
    open_rows = session.scalars(select(Regression).options(*REGRESSION_LOADS)
                                .where(Regression.state.in_(OPEN_STATES), Regression.direction == Direction.SLOWER)
                                .order_by(Regression.created_at))
    regressions = [regression_summary(r) for r in open_rows]
    latest = session.execute(text("SELECT * FROM latest_status ORDER BY workload, device")).mappings().all()
    return {
        "watched": watched,
        "compared": [{**w, "finished_at": _as_iso(w["finished_at"])} for w in compared],
        "open_regressions": [r for r in regressions if not r["silenced"]],
        "silenced_regressions": [r for r in regressions if r["silenced"]],
        "latest": [{k: _as_iso(v) for k, v in row.items()} for row in latest],
        "recent_runs": list_runs(session, limit=10),
        "try_jobs": try_jobs(session, 10),
    }


TRY_JOBS_SHOWN = 20  # the newest try jobs `abwatch status` and the overview list


def try_jobs(session: Session, limit: int = TRY_JOBS_SHOWN) -> list[dict[str, Any]]:
    """The newest try jobs, as :func:`serialize.job_json` shows them."""
    return [serialize.job_json(j) for j in session.scalars(
        select(Job).where(Job.kind == "try").order_by(Job.id.desc()).limit(limit))]


def job_detail(session: Session, job_id: int) -> dict[str, Any]:
    """One queued job (a watch's ``test``, a person's ``try``); NotFound if there is none."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    return serialize.job_json(job)


BUILD_LOG_LINES = 40


def build_detail(session: Session, build_id: int) -> dict[str, Any]:
    """One build (:func:`serialize.build_json`: status, time, metrics, compiler-cache hits) with its
    commit's summary, the end of its log (secrets masked) and the runs that used it; NotFound if
    there is none."""
    build = session.get(Build, build_id)
    if build is None:
        raise NotFound(f"build {build_id} does not exist")
    runs = session.scalars(select(Run.id).where(or_(Run.control_build_id == build_id,
                                                    Run.treatment_build_id == build_id))
                           .order_by(Run.id.desc()).limit(50))
    return {**serialize.build_json(build), "summary": build.commit.summary,
            "store": manifest_of(session, build.artifact_key),
            "log_tail": serialize.log_tail(mask_secrets(build.log or ""), BUILD_LOG_LINES), "runs": list(runs)}


def watch_status(session: Session) -> dict:
    """What is watched (last seen/tested commit per branch, device, config), the queue per device
    and the newest try jobs.

    The shape of ``abwatch status --json``; a stable, documented reading for other tools.
    """
    branches = []
    for row in session.scalars(select(WatchProgress).order_by(WatchProgress.id)):
        counts: dict[str, int] = {}
        for (state,) in session.execute(select(WatchedCommit.status).where(WatchedCommit.progress_id == row.id)):
            counts[state.value] = counts.get(state.value, 0) + 1
        branches.append({
            "repository": row.repository.url, "branch": row.branch, "device": row.device,
            "config_hash": row.config_hash, "last_seen": row.last_seen_sha, "last_tested": row.last_tested_sha,
            "commits": counts, "message": row.message, "updated_at": row.updated_at.isoformat(),
        })
    running = [
        {"job": j.id, "device": j.device, "sha": j.payload.get("sha"), "worker": j.worker,
         "claimed_at": j.claimed_at.isoformat() if j.claimed_at else None}
        for j in session.scalars(select(Job).where(Job.status == "running").order_by(Job.id))
    ]
    open_regressions = session.scalar(
        select(func.count()).select_from(Regression)
        .where(Regression.state.in_([RegressionState.BENCHMARK, RegressionState.VERIFY, RegressionState.REGRESS]),
               Regression.direction == Direction.SLOWER))
    tries = try_jobs(session)
    return {"watched": branches, "queue": queue_counts(session), "running": running,
            "open_regressions": open_regressions, "try_jobs": tries}


def _summary(session: Session, sha: str | None) -> str | None:
    """The summary of commit ``sha`` (any repository's row: a sha names one commit)."""
    if sha is None:
        return None
    return session.scalar(select(Commit.summary).where(Commit.sha == sha).limit(1))


def _change_points(values: list[float], max_pvalue: float) -> list:
    return stats.change_points(values, max_pvalue=max_pvalue)


def queue_counts(session: Session) -> dict[str, dict[str, int]]:
    """``{device: {status: count}}`` of the queue, for ``abwatch status``."""
    rows = session.execute(text("SELECT device, status, COUNT(*) FROM jobs GROUP BY device, status"))
    out: dict[str, dict[str, int]] = {}
    for device, status, count in rows:
        out.setdefault(device, {})[status] = count
    return out
