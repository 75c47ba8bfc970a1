"""The shared artifact store's manifests: what files make an artifact, pushed to the store.

One row per artifact key, written only after every object it lists was pushed
(:mod:`abwatch.service.compare.shared`); a host that lacks the artifact fetches those objects
from ``[artifacts] store`` instead of building. Below :mod:`.models`, which re-exports it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from abwatch.service.store.base import Base, utcnow


class ArtifactManifest(Base):
    """An artifact in the shared store: its files (``{path: [sha256, size, mode]}``, links and
    empty directories), the build row it came from, and who pushed it where."""

    __tablename__ = "artifact_manifests"
    id: Mapped[int] = mapped_column(primary_key=True)
    artifact_key: Mapped[str] = mapped_column(String(128), unique=True)
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"), index=True)
    builder: Mapped[str] = mapped_column(String(64))
    sha: Mapped[str] = mapped_column(String(64))
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)
    # HMAC-SHA256 of the key and manifest (builders.artifact_store.canonical) with the fleet's
    # manifest key: a row without the right one is never used (migration 0031)
    mac: Mapped[str | None] = mapped_column(String(64), nullable=True)
    objects: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    store: Mapped[str] = mapped_column(String(1024))  # the store's URL as shown (no credentials)
    host: Mapped[str] = mapped_column(String(256))  # host:pid that pushed it (last)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
