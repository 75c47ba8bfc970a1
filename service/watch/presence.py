"""Device hosts: a worker registers its device (its fingerprint) and beats a heartbeat while it
lives, idle or in a job; a device silent for longer than ``watch.stale_after`` raises one alert.

``abwatch worker --device NAME`` (and ``abwatch watch`` for the devices it works itself) calls
:func:`register` once at start: the runner describes the device
(:meth:`~abwatch.runners.runner.Runner.prepare`, whose ``fingerprint`` picks the device row:
another fingerprint is another series, said in the log), and the device's ``device_hosts``
row records who serves it. A :class:`DeviceHeartbeat` thread then writes ``heartbeat_at`` every
``watch.heartbeat_s`` seconds (a minute: one UPDATE) through its own connection, and on each beat runs
:func:`check_stale` over every device: whichever process first finds a heartbeat older than
``watch.stale_after`` sets ``stale_since`` with a conditional UPDATE and records the
``stale`` alert in the outbox in the same transaction, so a silent device is alerted once
however many processes look; the device's next beat clears it and records ``recovered``.
A clean stop (SIGTERM) sets ``stopped_at``: the alert says the worker was stopped rather
than lost, but a device nobody serves is a data stoppage all the same.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

from abwatch.core.device_identity import DeviceInfo, summary
from abwatch.runners import make_runner
from abwatch.service.compare.liveness import Periodic
from abwatch.service.compare.progress import NullProgress, Progress
from abwatch.service.config import Config
from abwatch.service.notify import alerts
from abwatch.service.store.base import aware
from abwatch.service.store.models import DeviceHost, Job, JobStatus, utcnow
from abwatch.service.store.rows import current_device, device_note, insert_ignoring_conflict, seen_device
from abwatch.service.watch.device_config import for_device


def describe(config: Config, device: str) -> tuple[DeviceInfo | None, str | None]:
    """What the runner of ``device`` says of it (its fingerprint with it), or why it cannot
    (no GPU, an unreachable tracker): the worker still registers and beats, without one."""
    try:
        runner = make_runner(for_device(config, device))
    except Exception as exc:  # a worker that cannot describe its device still serves it: its jobs say why
        return None, f"device {device}: no fingerprint: {type(exc).__name__}: {exc}"
    try:
        return runner.prepare(), None
    except Exception as exc:  # RunnerUnavailable (no GPU, the tracker down): its jobs will say the same, each
        return None, f"device {device}: no fingerprint: {type(exc).__name__}: {exc}"
    finally:
        runner.teardown()


def register(engine: Engine, device: str, info: DeviceInfo | None, why: str | None, config: Config) -> list[str]:
    """Record that this process serves ``device``: its fingerprint's device row (a new series when
    it changed) and its ``device_hosts`` row, with a first heartbeat. The lines to log."""
    now = utcnow()
    with Session(engine, expire_on_commit=False) as session:
        device_id, note, said = None, why, [why] if why else []
        if info is not None:
            row, before = seen_device(session, info)
            device_id, note = row.id, device_note(session, row, before)  # its fingerprint changed: said, and kept
            said.append(note or f"device {device}: fingerprint {row.fingerprint_hash[:12] or '(none)'}: "
                                f"{summary(row.fingerprint or {})}")
        host, pid = socket.gethostname(), os.getpid()
        insert_ignoring_conflict(session, DeviceHost, {
            "name": device, "device_id": device_id, "host": host, "pid": pid, "registered_at": now,
            "heartbeat_at": now}, ["name"])
        session.execute(update(DeviceHost).where(DeviceHost.name == device).values(
            device_id=device_id, host=host, pid=pid, registered_at=now, heartbeat_at=now, stopped_at=None,
            message=note))
        said += _recovered(session, device, config)
        session.commit()
    return said


def beat(engine: Engine, devices: Iterable[str], config: Config) -> list[str]:
    """One heartbeat of ``devices`` from this process (a device alerted as silent is back). The
    lines to log."""
    said = []
    with Session(engine) as session:
        for device in devices:
            now, host, pid = utcnow(), socket.gethostname(), os.getpid()
            # its row, if registering found the database down
            insert_ignoring_conflict(session, DeviceHost, {"name": device, "host": host, "pid": pid,
                                                           "registered_at": now, "heartbeat_at": now}, ["name"])
            session.execute(update(DeviceHost).where(DeviceHost.name == device).values(
                heartbeat_at=now, host=host, pid=pid, stopped_at=None))
            said += _recovered(session, device, config)
        session.commit()
    return said


def stopped(engine: Engine, devices: Iterable[str]) -> None:
    """This process stops serving ``devices`` cleanly (SIGTERM, Ctrl-C): said on their rows."""
    with Session(engine) as session:
        session.execute(update(DeviceHost).where(DeviceHost.name.in_(list(devices)), DeviceHost.pid == os.getpid(),
                                                 DeviceHost.host == socket.gethostname()).values(stopped_at=utcnow()))
        session.commit()



def document(session: Session, row: DeviceHost, now: datetime) -> dict:
    """What an alert says of a device: who served it, when it was last heard, its fingerprint, its queue."""
    current = current_device(session, row.name)
    heard = aware(row.heartbeat_at)
    queued = session.scalar(select(func.count()).select_from(Job).where(
        Job.device == row.name, Job.status == JobStatus.QUEUED)) or 0
    stopped_at = aware(row.stopped_at)
    return {"name": row.name, "host": row.host, "pid": row.pid, "heartbeat_at": heard.isoformat() if heard else None,
            "stopped_at": stopped_at.isoformat() if stopped_at else None,
            "silent_s": round((now - heard).total_seconds()) if heard else None,
            "fingerprint": current.fingerprint_hash if current is not None else None,
            "fingerprint_summary": summary(current.fingerprint or {}) if current is not None else None,
            "queued": queued}


def _recovered(session: Session, device: str, config: Config) -> list[str]:
    """Clear ``device``'s stale mark (once: a conditional UPDATE) and record the ``recovered`` alert."""
    row = session.scalar(select(DeviceHost).where(DeviceHost.name == device))
    if row is None or row.stale_since is None:
        return []
    since = aware(row.stale_since)
    cleared = session.execute(update(DeviceHost).where(DeviceHost.id == row.id, DeviceHost.stale_since.is_not(None))
                              .values(stale_since=None))
    if cleared.rowcount != 1:  # type: ignore[attr-defined]
        return []  # another beat of it cleared it a moment ago
    now = utcnow()
    text = (f"abwatch: device {device} is back: heard from {row.host}:{row.pid} again "
            f"(silent since {since.isoformat(timespec='seconds') if since else '?'})")
    alerts.enqueue_device(session, "recovered", document(session, row, now), text, config.alerts)
    return [text]


def check_stale(engine: Engine, config: Config) -> list[str]:
    """Mark every device whose heartbeat is older than ``watch.stale_after`` stale and record its
    ``stale`` alert, once (a conditional UPDATE: of several processes looking, one wins). Nothing
    when ``stale_after`` is off. The lines to log."""
    after = config.watch.stale_after_s
    if after is None:
        return []
    now = utcnow()
    cutoff = now - timedelta(seconds=after)
    said = []
    with Session(engine) as session:
        for row in session.scalars(select(DeviceHost).where(DeviceHost.heartbeat_at < cutoff,
                                                            DeviceHost.stale_since.is_(None))).all():
            marked = session.execute(update(DeviceHost).where(
                DeviceHost.id == row.id, DeviceHost.stale_since.is_(None), DeviceHost.heartbeat_at < cutoff)
                .values(stale_since=now))
            if marked.rowcount != 1:  # type: ignore[attr-defined]
                continue  # another process alerted it, or it beat again
            data = document(session, row, now)
            how = (f"its worker {row.host}:{row.pid} was stopped at {data['stopped_at'][:19]}" if data["stopped_at"]
                   else f"last heartbeat from {row.host}:{row.pid} at {(data['heartbeat_at'] or '?')[:19]}")
            text = (f"abwatch: device {row.name} is silent: no heartbeat for {_span(data['silent_s'])} (stale_after "
                    f"{config.watch.stale_after}); {how}; "
                    f"{data['queued']} job(s) wait for it: no data from it until a worker serves it again")
            alerts.enqueue_device(session, "stale", data, text, config.alerts)
            said.append(text)
        session.commit()
    return said


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class DeviceHeartbeat(Periodic):
    """Beats ``devices``' heartbeat and checks every device for staleness every ``watch.heartbeat_s``,
    from a thread of its own through its own connections: idle or in a job, the beat goes on
    (a job's run has its own, :class:`~abwatch.service.compare.liveness.Heartbeat`). With no
    devices it only checks (the watch that works no device itself)."""

    def __init__(self, engine: Engine, devices: Iterable[str], config: Config, progress: Progress | None = None,
                 unregistered: Iterable[str] = ()) -> None:
        super().__init__(config.watch.heartbeat_s, "heartbeat-devices")
        self.engine, self.devices, self.config = engine, list(devices), config
        self.unregistered = list(unregistered)  # registering found the database down: done on a beat
        self.progress = progress or NullProgress()
        self.said = threading.Event()  # set when a beat recorded an alert: the loop sends it

    def failed(self, exc: Exception) -> None:
        """Said in the worker's log: the device's beat or the staleness check is broken."""
        self.progress.message(f"device heartbeat failed: {type(exc).__name__}: {exc} (said once; it goes on trying)")

    def tick(self) -> None:
        """Register what is left to, beat, check, and say what changed."""
        while self.unregistered:
            for line in register(self.engine, self.unregistered[0], *describe(self.config, self.unregistered[0]),
                                 self.config):
                self.progress.message(line)
            self.unregistered.pop(0)
        for line in beat(self.engine, self.devices, self.config) + check_stale(self.engine, self.config):
            self.progress.message(line)
            self.said.set()
