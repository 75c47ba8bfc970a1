"""The devices as a person looks at them (``GET /api/devices``, the dashboard's devices page):
one entry per device name, with its current fingerprint and the earlier ones (each a series),
the host that serves it and its last heartbeat, whether it went silent, and its queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.core.device_identity import summary
from abwatch.service.store.base import aware
from abwatch.service.store.models import Device, DeviceHost, Job, JobStatus, Run, utcnow



def _iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat() if value is not None else None


def _state(host: DeviceHost | None) -> str:
    """``stale`` (silent past ``watch.stale_after``: alerted), ``stopped`` (its worker ended
    cleanly), ``serving`` (a worker beats its heartbeat), or ``unserved`` (no worker ever
    registered it: measured by ``compare`` alone)."""
    if host is None:
        return "unserved"
    if host.stale_since is not None:
        return "stale"
    return "stopped" if host.stopped_at is not None else "serving"


def _fingerprints(session: Session, name: str) -> list[dict[str, Any]]:
    """Each fingerprint of device ``name`` (a device row, a series), the one seen last first."""
    runs = func.count(Run.id)
    rows = session.execute(
        select(Device, runs).outerjoin(Run, Run.device_id == Device.id).where(Device.name == name)
        .group_by(Device.id).order_by(Device.last_seen_at.desc().nulls_last(), Device.id.desc())).all()
    return [{"device_id": d.id, "hash": d.fingerprint_hash, "summary": summary(d.fingerprint or {}),
             "fingerprint": d.fingerprint, "kind": d.kind, "first_seen_at": _iso(d.first_seen_at),
             "last_seen_at": _iso(d.last_seen_at), "runs": count} for d, count in rows]


def list_devices(session: Session) -> list[dict[str, Any]]:
    """Every device name known (measured, registered by a worker, or with jobs queued), sorted."""
    names = set(session.scalars(select(Device.name))) | set(session.scalars(select(DeviceHost.name))) | set(
        session.scalars(select(Job.device).where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))))
    hosts = {h.name: h for h in session.scalars(select(DeviceHost))}
    queue: dict[str, dict[str, int]] = {}
    for device, status, count in session.execute(
            select(Job.device, Job.status, func.count()).where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
            .group_by(Job.device, Job.status)):
        queue.setdefault(device, {})[JobStatus(status).value] = count
    now = utcnow()
    out = []
    for name in sorted(names):
        host = hosts.get(name)
        prints = _fingerprints(session, name)
        heard = aware(host.heartbeat_at) if host is not None else None
        out.append({
            "name": name, "state": _state(host),
            "fingerprint": prints[0] if prints else None, "fingerprints": prints,
            "host": host.host if host else None, "pid": host.pid if host else None,
            "registered_at": _iso(host.registered_at) if host else None,
            "heartbeat_at": _iso(heard), "silent_s": round((now - heard).total_seconds()) if heard else None,
            "stopped_at": _iso(host.stopped_at) if host else None,
            "stale_since": _iso(host.stale_since) if host else None,
            "message": host.message if host else None,
            "queued": queue.get(name, {}).get("queued", 0), "running": queue.get(name, {}).get("running", 0),
        })
    return out
