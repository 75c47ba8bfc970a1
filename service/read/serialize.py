"""The JSON shapes of what abwatch stores: one serializer per thing, shared by the CLI's
``--json``, the HTTP API, the dashboard and alerts, so they cannot drift apart."""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy.orm import Session

from abwatch.core.redact import mask_secrets
from abwatch.service.compare.building import build_failure
from abwatch.service.read.stored import StoredRun
from abwatch.service.store import explain
from abwatch.service.store.models import Build, Job, Regression

LOG_TAIL_LINES = 25


def decisive_p(v) -> tuple[float | None, str]:
    """The p-value that decided a verdict and its label: BH-adjusted across the run's
    workloads when a correction was applied, else the raw one."""
    if v.correction != "none" and v.p_adjusted is not None:
        return v.p_adjusted, "BH-adjusted"
    return v.p_value, "raw"


def outcome_json(stored: StoredRun) -> dict:
    """The ``--json`` object of ``compare``, ``verify`` and ``show``: the outcome, which p
    decided each verdict, the failed builds' logs, and when its raw samples were pruned (or null)."""
    data = stored.outcome.to_json()
    for result, r in zip(data["results"], stored.outcome.results, strict=True):
        result["p_decisive"] = "p_adjusted" if decisive_p(r.verdict)[1] == "BH-adjusted" else "p_value"
        result["n_counts"] = "samples"
        result.setdefault("correctness_regression_id", r.correctness_regression_id)
    for build, b in zip(data["builds"], stored.outcome.builds, strict=True):
        build["build_id"] = b.build_id
        if b.reused:  # this place took another place's artifact: which build made it
            build["reused"] = b.reused
        if b.build_id in stored.failed_logs:
            build["log_tail"] = log_tail(stored.failed_logs[b.build_id])
            build["failure"] = build_failure(stored.failed_logs[b.build_id])
    pruned = stored.samples_pruned_at
    data["samples_pruned_at"] = pruned.isoformat() if pruned else None
    return data


def pruned_note(pruned_at) -> str:
    """What a report says of a run whose raw samples were pruned (``db prune``, ``[retention]``)."""
    return (f"raw samples pruned {pruned_at.isoformat(timespec='seconds')}: the verdicts, the figures they were "
            "judged on and each process's wall and CPU time are kept; per-process sample charts are not")


def log_tail(log: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a build log."""
    return "\n".join(log.rstrip().splitlines()[-lines:])


def regression_json(session: Session, r: Regression) -> dict:
    """The ``--json`` shape of a regression with its state history (:meth:`Regression.to_dict`,
    which alerts send too) and what explains it (:func:`service.store.explain.of_regression`):
    ``abwatch regressions --json`` and ``GET /api/regressions/{id}`` both give this."""
    return {**r.to_dict(), "explanation": explain.of_regression(session, r)}


def short_sha(sha: str) -> str:
    """A git sha cut to 12 characters; anything else (a release version) whole."""
    return sha[:12] if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha) else sha


def runs_json(rows) -> list[dict]:
    """The ``--json`` shape of ``abwatch runs``."""
    return [{"id": r.id, "run_type": r.run_type.value, "status": r.status.value,
             "control_ref": r.control_ref, "treatment_ref": r.treatment_ref,
             "control_sha": r.control_commit.sha, "treatment_sha": r.treatment_commit.sha,
             "device": r.device.name if r.device else None, "parent_run_id": r.parent_run_id,
             "started_at": r.started_at.isoformat() if r.started_at else None,
             "finished_at": r.finished_at.isoformat() if r.finished_at else None,
             "verdicts": counts, "build_verdicts": built} for r, counts, built in rows]


def builds_json(rows) -> list[dict]:
    """The ``--json`` shape of ``abwatch builds``."""
    return [{**build_json(b), "log_tail": log_tail(mask_secrets(b.log or ""), 5)} for b in rows]


def build_json(b: Build) -> dict:
    """One build row: its commit, builder, status, time, metrics and compiler-cache counts
    (``abwatch builds --json``, ``GET /api/builds/{id}``, the build page)."""
    return {"id": b.id, "sha": b.commit.sha, "builder": b.builder, "status": b.status.value,
            "cached": b.cached, "duration_s": b.duration_s, "artifact_key": b.artifact_key,
            "place": b.place,
            "config_hash": b.config_hash, "created_at": b.created_at.isoformat() if b.created_at else None,
            "metrics": b.metrics or {}, "compiler_cache": compiler_cache_json(b.metrics)}


def compiler_cache_json(metrics: dict | None) -> dict | None:
    """A build's ccache counts from its metrics: hits (local and remote, where the build stored
    them apart), misses, hit rate, the shared remote storage (its URL as stored, never with a
    password) and what happened to it (``used``, ``unreachable``: the build ran on the local
    cache alone, ``failed``: requests failed during the build); ``summary`` is the one line the
    CLI and the pages print. None for a build without ccache (cached, or another builder)."""
    m = metrics or {}
    if m.get("ccache_hits") is None:
        return None
    data = {"hits": m["ccache_hits"], "local_hits": m.get("ccache_local_hits"),
            "remote_hits": m.get("ccache_remote_hits"), "misses": m.get("ccache_misses", 0),
            "hit_rate": m.get("ccache_hit_rate"), "remote": m.get("ccache_remote"),
            "remote_state": m.get("ccache_remote_state"), "remote_errors": m.get("ccache_remote_errors")}
    rate = f" ({data['hit_rate']:.0%})" if data["hit_rate"] is not None else ""
    if data["local_hits"] is None:  # stored before hits were told apart
        summary = f"{data['hits']} hits, {data['misses']} misses{rate}"
    else:
        summary = f"{data['local_hits']} local + {data['remote_hits']} remote hits, {data['misses']} misses{rate}"
    if data["remote_state"] == "unreachable":
        summary += "; remote unreachable: local cache only"
    elif data["remote_state"] == "failed":
        summary += f"; remote failed {data['remote_errors']} request(s)"
    return {**data, "summary": summary}


def history_json(workload: str, points, found) -> dict:
    """The ``--json`` shape of ``abwatch history``."""
    return {
        "workload": workload,
        "series": [{"sha": p.sha, "median_ms": p.median_ms, "runs": p.runs,
                    "committed_at": p.committed_at.isoformat() if p.committed_at else None} for p in points],
        "steps": [{"last_before": s.last_before.sha, "first_after": s.first_after.sha,
                   "change_pct": s.change_pct, "p_value": s.p_value} for s in found],
    }


def cache_json(cache, entries, size: int, compiler: dict | None = None, store: dict | None = None) -> dict:
    """The ``--json`` shape of ``abwatch cache``: the artifact cache, ``compiler_cache``
    (``service.read.ccache_report``; null unless the config builds from source) and
    ``artifact_store`` (``service.read.artifact_report``; null without ``[artifacts] store``)."""
    return {"root": str(cache.root), "bytes": size, "entries": [asdict(e) for e in entries],
            "compiler_cache": compiler, "artifact_store": store}


def job_json(job: Job) -> dict:
    """A queued job (a watch's ``test``, a person's ``try``) as ``GET /api/jobs/{id}``, ``abwatch
    try --json`` and the job page show it: where it is and, once done, its result (its runs)."""
    return {"id": job.id, "kind": job.kind, "device": job.device, "status": job.status.value,
            "payload": job.payload, "result": job.result, "error": job.error, "attempts": job.attempts,
            "created_at": job.created_at.isoformat() if job.created_at else None,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None}
