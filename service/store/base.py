"""The declarative base every table derives from, its naming convention, and the clock."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy import JSON, Enum, MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the models use."""
    return datetime.now(UTC)


@overload
def aware(value: datetime) -> datetime: ...
@overload
def aware(value: None) -> None: ...
def aware(value: datetime | None) -> datetime | None:
    """A stored time as UTC-aware: SQLite hands back naive datetimes (stored as UTC)."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints stably."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _enum(cls: type[enum.Enum], name: str, length: int = 32, *, checked: bool = True) -> Enum:
    """An enum stored by value as a string; with a CHECK of its values unless ``checked`` is
    False (a plug-in vocabulary such as the metric registry's, which grows without a migration:
    the application validates it on every read and write)."""
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=checked,
        length=length,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )
