"""Get-or-create helpers that keep one row per repository, commit, device, workload and
successful build, however many processes write at once; and the bulk write path for raw
samples (COPY on PostgreSQL).

Each get-or-create is ``INSERT ... ON CONFLICT DO NOTHING`` on the row's unique key, then a
SELECT: two processes that meet the same new commit both succeed and get the same row (the
second INSERT waits for the first one's transaction and then does nothing), where a
select-then-insert would have failed one of them with a unique violation.
"""

from __future__ import annotations

import csv
import io
from typing import Any, cast
from collections.abc import Iterable, Sequence

from sqlalchemy import ColumnElement, Table, TextClause, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from abwatch.core.redact import mask_url
from abwatch.core.commit_info import CommitInfo
from abwatch.core.config_base import spec_hash
from abwatch.core.device_identity import DeviceInfo, changes, digest as fingerprint_digest
from abwatch.service.store.models import Base, Build, BuildStatus, Commit, Device, Repository, Run, Workload, utcnow

# Spec fields that do not change what is timed: changing them keeps the workload's series.
NOT_IDENTITY = frozenset({"name", "timeout_s", "rtol", "atol", "memory_bound", "children_per_server"})


def insert_ignoring_conflict(session: Session, model: type[Base], values: dict[str, Any],
                             key: Sequence[str], where: ColumnElement | TextClause | None = None) -> None:
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` of one row, in the session's transaction.

    ``where`` is the predicate of a partial unique index on ``key``.
    """
    dialect = session.get_bind().dialect.name
    table = cast(Table, model.__table__)
    statement: postgresql.Insert | sqlite.Insert
    if dialect == "postgresql":
        statement = postgresql.insert(table)
    elif dialect == "sqlite":
        statement = sqlite.insert(table)
    else:  # pragma: no cover - make_engine accepts these two only
        raise NotImplementedError(f"get-or-create on {dialect}")
    session.execute(statement.values(**values).on_conflict_do_nothing(index_elements=list(key), index_where=where))


def get_repository(session: Session, url: str) -> Repository:
    """The row of the repository at ``url``, created on first sight.

    A repository's identity is its URL with credentials masked (:func:`mask_url`), whoever
    asks: the password is never stored, and the same repository reached by a compare, the
    watch or a bisection (or with another token) is one row, one history.
    """
    url = mask_url(url)
    insert_ignoring_conflict(session, Repository, {"url": url, "created_at": utcnow()}, ["url"])
    return session.scalars(select(Repository).where(Repository.url == url)).one()


def get_commit(session: Session, repository: Repository, info: CommitInfo) -> Commit:
    """The row of commit ``info.sha`` in ``repository``, created on first sight.

    A caller that creates several commits in one transaction creates them in sha order, so
    two transactions never wait for each other's rows in opposite orders (a deadlock).
    """
    insert_ignoring_conflict(session, Commit, {
        "repository_id": repository.id, "sha": info.sha, "summary": info.summary, "author": info.author,
        "committed_at": info.committed_at, "committed_offset_min": info.committed_offset_min},
        ["repository_id", "sha"])
    row = session.scalars(
        select(Commit).where(Commit.repository_id == repository.id, Commit.sha == info.sha)).one()
    if row.committed_offset_min is None and info.committed_offset_min is not None:
        # stored before offsets were (SQLite kept only a wall clock) or from the sha alone: git's
        # time replaces it; written only then, so a commit met again takes no row lock
        row.committed_at, row.committed_offset_min = info.committed_at, info.committed_offset_min
        session.flush()
    return row


def get_commits(session: Session, repository: Repository, infos: Iterable[CommitInfo]) -> dict[str, Commit]:
    """``{sha: row}`` of several commits, created in sha order (see :func:`get_commit`)."""
    unique = {info.sha: info for info in infos}
    return {sha: get_commit(session, repository, unique[sha]) for sha in sorted(unique)}


def get_device(session: Session, description: DeviceInfo) -> Device:
    """The row of the device a runner described: its name with its fingerprint (created on first
    sight, a new series); its hardware description is refreshed and it is marked seen now."""
    return seen_device(session, description)[0]


def seen_device(session: Session, description: DeviceInfo) -> tuple[Device, Device | None]:
    """:func:`get_device`, and the row of the same name that was seen last before it when that is
    another fingerprint (None when the device's fingerprint is the one seen last, or it is new).

    A row stored before fingerprints (an empty hash) is taken over by the first fingerprint its
    name shows, while its name has no other row: its runs stay its series.
    """
    name, hardware, fingerprint = description.name, description.hardware_config, description.fingerprint
    digest = fingerprint_digest(fingerprint) if fingerprint else ""  # a runner that knows none: one row, as before
    before = current_device(session, name)
    now = utcnow()
    if before is not None and before.fingerprint_hash == "" and digest and session.scalar(
            select(func.count()).select_from(Device).where(Device.name == name)) == 1:
        # one UPDATE that only the first process to get here makes (the others find the hash set)
        session.execute(update(Device).where(Device.id == before.id, Device.fingerprint_hash == "")
                        .values(fingerprint=fingerprint, fingerprint_hash=digest))
    insert_ignoring_conflict(session, Device, {"name": name, "kind": description.kind, "hardware_config": hardware,
                                               "fingerprint": fingerprint, "fingerprint_hash": digest,
                                               "first_seen_at": now, "last_seen_at": now},
                             ["name", "fingerprint_hash"])
    row = session.scalars(select(Device).where(Device.name == name, Device.fingerprint_hash == digest)
                          .execution_options(populate_existing=True)).one()  # the row the UPDATE took over too
    if row.hardware_config != hardware:  # the host name, the OS: not the fingerprint, kept up to date
        row.hardware_config = hardware
    row.last_seen_at = now
    row.first_seen_at = row.first_seen_at or now  # a row stored before fingerprints, never run on
    session.flush()
    return row, (before if before is not None and before.id != row.id else None)


def current_device(session: Session, name: str) -> Device | None:
    """The row of device ``name`` seen last (its current fingerprint), None if there is none."""
    return session.scalars(select(Device).where(Device.name == name)
                           .order_by(Device.last_seen_at.desc().nulls_last(), Device.id.desc()).limit(1)).first()


def device_note(session: Session, row: Device, before: Device | None) -> str | None:
    """What a run (or a worker) says of device ``row`` (from :func:`seen_device`): that its
    fingerprint changed and a new series starts (no run on this row yet, another row of its name),
    or that an earlier series resumes (the fingerprint seen last before was another); else None."""
    had_runs = session.scalar(select(Run.id).where(Run.device_id == row.id).limit(1)) is not None
    earlier = before if before is not None or had_runs else session.scalars(
        select(Device).where(Device.name == row.name, Device.id != row.id)
        .order_by(Device.last_seen_at.desc().nulls_last(), Device.id.desc()).limit(1)).first()
    if earlier is None:
        return None
    what = "; ".join(changes(earlier.fingerprint or {}, row.fingerprint or {})) or "another hash"
    hashes = f"{earlier.fingerprint_hash[:12] or 'none'} -> {row.fingerprint_hash[:12] or 'none'}"
    if had_runs:
        return (f"device {row.name}'s fingerprint changed back ({what}; {hashes}): the series of device row "
                f"{row.id} resumes")
    return f"device {row.name}'s fingerprint changed ({what}; {hashes}): a new series starts (device row {row.id})"


def workload_spec_hash(kind: str, spec: dict) -> str:
    """The hash that, with the repository and the name, identifies a workload's series.

    Fields that do not change what is timed (:data:`NOT_IDENTITY`) are left out, and so are
    empty values (an empty ``env`` is the same as none), so a field that a newer abwatch adds
    with an empty default does not start new series for every workload.
    """
    kept = {k: v for k, v in spec.items() if k not in NOT_IDENTITY and v not in (None, {}, [], "")}
    # The series is on the first metric in ``measure``: on time (the default, and every series
    # made before ``measure`` existed) it leaves no trace; a series on instructions is its own.
    if kept.get("measure", ["time"])[0] == "time":
        kept.pop("measure", None)
    return spec_hash({"kind": kind, **kept})


def get_workload(session: Session, repository_id: int, name: str, kind: str, spec: dict) -> Workload:
    """The row of workload ``name`` with this spec in this repository, created on first sight.

    A changed spec is a new row (a new series); :func:`earlier_series` finds the one before.
    """
    digest = workload_spec_hash(kind, spec)
    insert_ignoring_conflict(session, Workload, {
        "repository_id": repository_id, "name": name, "spec_hash": digest, "kind": kind, "spec": spec},
        ["repository_id", "name", "spec_hash"])
    return session.scalars(select(Workload).where(
        Workload.repository_id == repository_id, Workload.name == name, Workload.spec_hash == digest)).one()


def earlier_series(session: Session, workload: Workload) -> Workload | None:
    """The newest other series of the same name in the same repository (another spec), if any."""
    return session.scalars(
        select(Workload).where(Workload.repository_id == workload.repository_id, Workload.name == workload.name,
                               Workload.id != workload.id)
        .order_by(Workload.id.desc()).limit(1)).first()


def get_success_build(session: Session, commit_id: int, builder_kind: str, config_hash: str, artifact,
                      submodule_pin: str | None, place: str) -> Build:
    """The row of a successful build's artifact for a run in ``place`` (``host:cache_dir``).

    Built here: this place's own row (the first process here that stored it made it; its time,
    ``cached`` false), even when another place built the same artifact too. Served by this
    place's cache: this place's row, or else the row of the build it reused (fetched from the
    artifact store, or cached before rows said where; :func:`service.compare.building.reuse`
    names it), never a row that claims it was built here. ``submodule_pin``: ``path@sha`` of a
    submodule built at another commit than ``commit_id``'s."""
    success = select(Build).where(Build.artifact_key == artifact.key, Build.status == BuildStatus.SUCCESS)
    mine = session.scalars(success.where(Build.place == place).order_by(Build.id)).first()
    if mine is not None:
        return mine
    if artifact.cached:
        other = session.scalars(success.order_by(Build.id)).first()
        if other is not None:
            return other
    insert_ignoring_conflict(session, Build, {
        "commit_id": commit_id, "builder": builder_kind, "config_hash": config_hash, "submodule_pin": submodule_pin,
        "status": BuildStatus.SUCCESS, "artifact_key": artifact.key, "cached": artifact.cached, "place": place,
        "log": artifact.log, "duration_s": artifact.duration_s, "metrics": artifact.metrics or None,
        "created_at": utcnow()}, ["artifact_key", "place"], where=text("status = 'success'"))
    return session.scalars(success.where(Build.place == place)).one()


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
            raw = connection.connection.dbapi_connection
            assert raw is not None  # a connection checked out of the pool has its DBAPI connection
            cursor = raw.cursor()
            try:
                cursor.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN "
                                   f"WITH (FORMAT csv, NULL '{_NULL}')", buffer)
            finally:
                cursor.close()
        return count
    target = Base.metadata.tables[table]
    batch = [dict(zip(columns, row, strict=True)) for row in rows]
    if batch:
        connection.execute(insert(target), batch)
    return len(batch)


_NULL = r"\N"
SAMPLE_COLUMNS = ("invocation_id", "run_id", "workload_id", "side", "order_index", "runtime_ms", "warmup", "cpu_ms")


def write_samples(session: Session, rows: Iterable[Sequence]) -> int:
    """Store raw samples, each a tuple in :data:`SAMPLE_COLUMNS` order (side as its value)."""
    return copy_rows(session, "samples", SAMPLE_COLUMNS, rows)
