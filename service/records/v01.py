"""TVM benchmark records, schema v0.1: validation, import (all or nothing) and export.

Field names follow TVM's benchmark record schema v0.1. The queryable core (workload,
engine, engine_version, hardware, mean, std, timestamp, schema version) has columns of
its own; every other field, including ones this schema version does not name, is kept
verbatim in ``records.fields`` so that an imported record exports back unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, TextIO
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.core.safejson import MAX_MS, BadValue, check, loads
from abwatch.core.errors import UsageError
from abwatch.service.config import format_validation_error
from abwatch.service.store.models import Record

SCHEMA_VERSION = "0.1"
CORE_FIELDS = (
    "workload", "engine", "hardware", "runtime_ms_mean", "runtime_ms_std",
    "timestamp", "schema_version",
)
DICT_FIELDS = (
    "metadata", "workload_args", "workload_metadata", "engine_config", "compilation_config",
    "software_config", "runtime_config", "hardware_config", "execution_config", "metrics",
)


class RecordError(UsageError):
    """A record file that does not parse or whose records do not validate."""


class BenchmarkRecord(BaseModel):
    """One record of the v0.1 schema; types are strict (a string is not a number)."""

    model_config = ConfigDict(strict=True, extra="allow")

    # lengths are the columns' (the same limit on SQLite, which would not enforce them)
    workload: str = Field(min_length=1, max_length=256)
    engine: str = Field(min_length=1, max_length=64)
    hardware: str = Field(min_length=1, max_length=256)
    runtime_ms_mean: float
    runtime_ms_std: float
    timestamp: float | str
    schema_version: str
    engine_version: str | None = Field(default=None, max_length=128)
    metadata: dict[str, Any] = Field(default_factory=dict)
    workload_args: dict[str, Any] = Field(default_factory=dict)
    workload_metadata: dict[str, Any] = Field(default_factory=dict)
    engine_config: dict[str, Any] = Field(default_factory=dict)
    compilation_config: dict[str, Any] = Field(default_factory=dict)
    software_config: dict[str, Any] = Field(default_factory=dict)
    runtime_config: dict[str, Any] = Field(default_factory=dict)
    hardware_config: dict[str, Any] = Field(default_factory=dict)
    execution_config: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    runtime_raw: list[dict[str, Any]] | None = None

    @field_validator("runtime_ms_mean", "runtime_ms_std")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value) or not 0 <= value <= MAX_MS:
            raise ValueError(f"must be a finite number between 0 and {MAX_MS:g}")
        return value

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema version {value!r} (this abwatch reads {SCHEMA_VERSION!r})")
        return value


def to_row(record: BenchmarkRecord, run_id: int | None = None, side=None) -> Record:
    """The database row of a validated record; fields given in the input are kept verbatim."""
    given = record.model_dump(exclude_unset=True)
    fields = {key: value for key, value in given.items() if key not in CORE_FIELDS}
    core = {key: given.get(key, getattr(record, key)) for key in CORE_FIELDS}
    return Record(
        record_key=record_key({**core, **fields}),
        run_id=run_id,
        side=side,
        workload=record.workload,
        engine=record.engine,
        engine_version=record.engine_version,
        hardware=record.hardware,
        runtime_ms_mean=record.runtime_ms_mean,
        runtime_ms_std=record.runtime_ms_std,
        timestamp=record.timestamp,
        schema_version=record.schema_version,
        fields=fields,
    )


def record_key(record: dict[str, Any]) -> str:
    """The record's identity: sha256 of its canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def add_new(session: Session, rows: list[Record]) -> tuple[list[Record], int]:
    """Add the rows whose record is not stored yet (nor repeated among ``rows``); return the
    added rows and how many were skipped as already there."""
    keys = [row.record_key for row in rows]
    stored: set[str] = set()
    for start in range(0, len(keys), 500):
        stored.update(session.scalars(select(Record.record_key).where(Record.record_key.in_(keys[start:start + 500]))))
    new, seen = [], set(stored)
    for row in rows:
        if row.record_key is None or row.record_key in seen:
            continue
        seen.add(row.record_key)
        new.append(row)
    session.add_all(new)
    session.flush()
    return new, len(rows) - len(new)


def to_dict(row: Record) -> dict[str, Any]:
    """A stored record as a v0.1 JSON object (core fields first, then the rest)."""
    out: dict[str, Any] = {key: getattr(row, key) for key in CORE_FIELDS}
    out.update(row.fields)
    return out


def _load_objects(path: Path) -> list[tuple[str, Any]]:
    """(where, object) pairs from a JSON array, a single object, or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read: {exc}") from None
    try:
        whole = loads(text, str(path))
    except json.JSONDecodeError:
        whole = None
    except BadValue as exc:
        raise RecordError(str(exc)) from None
    if isinstance(whole, list):
        return [(f"{path}: record {i + 1}", obj) for i, obj in enumerate(whole)]
    if isinstance(whole, dict):  # one object: a pretty-printed file, or a one-line JSONL file
        label = "record" if "\n" in text.strip() else "line"
        return [(f"{path}: {label} 1", whole)]
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            objects.append((f"{path}: line {number}", loads(line, f"{path}: line {number}")))
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}: line {number}: invalid JSON: {exc.msg}") from None
        except BadValue as exc:
            raise RecordError(str(exc)) from None
    return objects


def validate_objects(objects: Iterable[tuple[str, Any]]) -> list[BenchmarkRecord]:
    """Validate every object; one bad record rejects all, naming its place and field."""
    records, errors = [], []
    for where, obj in objects:
        if not isinstance(obj, dict):
            errors.append(f"{where}: (top level): expected a JSON object")
            continue
        try:  # values every path must refuse (files, API bodies, converted reports)
            check(obj, where)
        except BadValue as exc:
            errors.append(str(exc))
            continue
        try:
            records.append(BenchmarkRecord.model_validate(obj))
        except ValidationError as exc:
            errors.append(format_validation_error(where, exc))
    if errors:
        raise RecordError("\n".join(errors))
    return records


def import_records(session: Session, path: Path) -> tuple[list[Record], int]:
    """Validate all records in ``path`` and store the ones not stored yet; on any error store
    none. Returns the stored rows and how many records were already there (importing a file
    twice stores it once)."""
    objects = _load_objects(Path(path))
    if not objects:
        raise RecordError(f"{path}: no records found")
    return add_new(session, [to_row(record) for record in validate_objects(objects)])


def export_records(session: Session, out: TextIO, run_id: int | None = None,
                   workload: str | None = None) -> int:
    """Write stored records as JSON lines; return how many."""
    query = select(Record).order_by(Record.id)
    if run_id is not None:
        query = query.where(Record.run_id == run_id)
    if workload is not None:
        query = query.where(Record.workload == workload)
    count = 0
    for row in session.scalars(query):
        try:  # allow_nan=False: a row stored before the edge checks must not make invalid JSON
            out.write(json.dumps(to_dict(row), sort_keys=False, allow_nan=False) + "\n")
        except ValueError:
            raise RecordError(f"record {row.id}: holds a value that is not valid JSON (NaN or Infinity)") from None
        count += 1
    return count
