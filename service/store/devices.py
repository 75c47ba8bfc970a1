"""The devices: one row per (name, fingerprint), each a series of its own, and one row per device
name for the host that serves it (its worker's heartbeat). Below :mod:`.models` (runs,
regressions and noise profiles point at a device row), which re-exports both."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from abwatch.service.store.base import Base


class Device(Base):
    """A machine (or board) that runs workloads, as one fingerprint of it.

    The identity is (name, fingerprint hash): the same name with other hardware (another CPU,
    kernel, GPU driver or TVM target: :mod:`abwatch.runners.fingerprint`) is another row, so runs,
    noise profiles, regressions and the views keep them apart, as a workload's changed spec
    does. A row stored before fingerprints has an empty hash; the first fingerprint seen under
    its name takes it over (:func:`abwatch.service.store.rows.get_device`).
    """

    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("name", "fingerprint_hash", name="uq_devices_name_fingerprint"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256))  # looked up through the unique key, whose first column it is
    kind: Mapped[str] = mapped_column(String(32))
    hardware_config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(default=dict)
    fingerprint_hash: Mapped[str] = mapped_column(String(64), default="")
    first_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # when a run started on it or a worker registered it: the newest row of a name is its current fingerprint
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DeviceHost(Base):
    """Who serves a device name: the worker that registered it last (its host, pid, the device
    row of its fingerprint), its heartbeat, and the data-stoppage alert.

    ``stale_since`` is set once, by whichever process first finds the heartbeat older than
    ``watch.stale_after`` (the alert is recorded in that same transaction), and cleared by the
    next heartbeat (which records that the device is back).
    """

    __tablename__ = "device_hosts"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(256), unique=True)
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # its worker ended cleanly
    stale_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    message: Mapped[str | None] = mapped_column(Text)  # the registration's last word (a changed fingerprint, ...)
    device: Mapped[Device | None] = relationship()
