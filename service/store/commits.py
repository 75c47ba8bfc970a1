"""The repositories and commits every other table points at: below :mod:`.models` (the runs and
what they found) and :mod:`.jobs` (the watch's tables), which both refer to them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from abwatch.service.store.base import Base, utcnow


class Repository(Base):
    """A git repository under watch."""

    __tablename__ = "repositories"
    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(String(1024), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Commit(Base):
    """One commit of a repository."""

    __tablename__ = "commits"
    __table_args__ = (UniqueConstraint("repository_id", "sha"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    sha: Mapped[str] = mapped_column(String(64), index=True)
    summary: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str] = mapped_column(String(256), default="")
    # the instant in UTC (before 1970 too); the committer's offset apart, in minutes (git
    # accepts up to +-99:59, timestamptz only +-15:59); NULL: unknown (stored before 0020)
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    committed_offset_min: Mapped[int | None] = mapped_column(Integer)
    repository: Mapped[Repository] = relationship()
