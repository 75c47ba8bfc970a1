"""Small get-or-create helpers that keep one row per repository, commit, device, workload;
and the bulk write path for raw samples (COPY on PostgreSQL)."""

from __future__ import annotations

import csv
import io
from typing import Iterable, Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from abwatch.service.models import Base, Commit, Device, Repository, Workload
from abwatch.builders.spec import CommitInfo
from abwatch.runners.base import DeviceInfo


def get_repository(session: Session, url: str) -> Repository:
    """The row of the repository at ``url``, created on first sight."""
    row = session.scalar(select(Repository).where(Repository.url == url))
    if row is None:
        row = Repository(url=url)
        session.add(row)
        session.flush()
    return row


def get_commit(session: Session, repository: Repository, info: CommitInfo) -> Commit:
    """The row of commit ``info.sha`` in ``repository``, created on first sight."""
    row = session.scalar(
        select(Commit).where(Commit.repository_id == repository.id, Commit.sha == info.sha)
    )
    if row is None:
        row = Commit(
            repository_id=repository.id, sha=info.sha, summary=info.summary,
            author=info.author, committed_at=info.committed_at,
        )
        session.add(row)
        session.flush()
    return row


def get_device(session: Session, description: DeviceInfo) -> Device:
    """The row of the device a runner described; its hardware description is refreshed."""
    row = session.scalar(select(Device).where(Device.name == description.name))
    if row is None:
        row = Device(name=description.name, kind=description.kind)
        session.add(row)
    row.hardware_config = description.hardware_config
    session.flush()
    return row


def get_workload(session: Session, name: str, kind: str, spec: dict) -> Workload:
    """The row of workload ``name``; its spec is refreshed to the config's current one."""
    row = session.scalar(select(Workload).where(Workload.name == name))
    if row is None:
        row = Workload(name=name, kind=kind)
        session.add(row)
    row.spec = spec
    session.flush()
    return row


def copy_rows(session: Session, table: str, columns: Sequence[str], rows: Iterable[Sequence]) -> int:
    """Append many rows to ``table`` in the session's transaction, fast; return how many.

    PostgreSQL gets one ``COPY ... FROM STDIN`` (CSV) on the session's own connection — an
    order of magnitude faster than INSERTs for the raw samples; other databases get one
    executemany. Values must be plain: strings, numbers, booleans, datetimes, None (JSON
    columns as already-encoded text). ``table`` and ``columns`` are names from code, never input.
    """
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        count = 0
        for row in rows:
            writer.writerow([_NULL if value is None else value for value in row])
            count += 1
        if count:
            buffer.seek(0)
            cursor = connection.connection.dbapi_connection.cursor()
            try:
                cursor.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN "
                                   f"WITH (FORMAT csv, NULL '{_NULL}')", buffer)
            finally:
                cursor.close()
        return count
    target = Base.metadata.tables[table]
    batch = [dict(zip(columns, row)) for row in rows]
    if batch:
        connection.execute(insert(target), batch)
    return len(batch)


_NULL = r"\N"
SAMPLE_COLUMNS = ("invocation_id", "run_id", "workload_id", "side", "order_index", "runtime_ms", "warmup")


def write_samples(session: Session, rows: Iterable[Sequence]) -> int:
    """Store raw samples, each a tuple in :data:`SAMPLE_COLUMNS` order (side as its value)."""
    return copy_rows(session, "samples", SAMPLE_COLUMNS, rows)
