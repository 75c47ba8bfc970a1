"""Locks that several abwatch processes share: PostgreSQL advisory locks and file locks.

Advisory locks are PostgreSQL's named locks that no table holds: a session-level one lives
as long as the connection that took it, so a process killed with ``kill -9`` frees its locks
when PostgreSQL notices the connection is gone. Keys are two integers, a namespace of this
module and a key within it. Who holds a lock is read from ``pg_locks`` and the holder
connection's ``application_name``, which abwatch sets to what the holder does (``abwatch
run 12 host:pid``), so a waiting process can say whom it waits for.

On SQLite the same places use file locks (``flock``, via the artifact cache's helper): one
SQLite file is used from one machine, where a file lock is what every process can see.

The per-device lock keeps two measurements off one device: a queue worker holds it while it
runs a job, and the driver takes it for its measuring phase. A process that holds a device's
lock already (a worker running a job) is not made to wait for itself.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
import zlib
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable, Iterator

from sqlalchemy import Connection, Engine, text

from abwatch.core.file_lock import flocked  # the one flock helper

# Namespaces of the two-integer advisory locks (the first integer); keys are the second.
DEVICE_LOCK, JOB_LOCK, SCHEMA_LOCK = 0x41420001, 0x41420002, 0x41420003
POLL_S = 1.0  # how often a waiting process tries again (a blocking wait could not be interrupted)
_LABEL_MAX = 63  # PostgreSQL truncates application_name to 63 bytes

_held_here: Counter[str] = Counter()  # devices whose lock this process holds
_held_lock = threading.Lock()


def lock_key(name: str) -> int:
    """A stable 31-bit key for a name (advisory locks take integers)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def whoami(what: str) -> str:
    """``what host:pid``: how a lock holder names itself."""
    return f"{what} {socket.gethostname()}:{os.getpid()}"


def label(connection: Connection, text_: str) -> None:
    """Set the connection's ``application_name`` (what ``pg_stat_activity`` shows for it)."""
    connection.execute(text("SELECT set_config('application_name', :v, false)"), {"v": text_[:_LABEL_MAX]})


def try_lock(connection: Connection, space: int, key: int) -> bool:
    """Take a session-level advisory lock if it is free; whether it was taken."""
    return bool(connection.execute(text("SELECT pg_try_advisory_lock(:s, :k)"), {"s": space, "k": key}).scalar())


def unlock(connection: Connection, space: int, key: int) -> None:
    """Release a session-level advisory lock this connection holds."""
    connection.execute(text("SELECT pg_advisory_unlock(:s, :k)"), {"s": space, "k": key})


def holder(connection: Connection, space: int, key: int) -> str | None:
    """Who holds an advisory lock: its connection's application name and backend pid; None if free."""
    row = connection.execute(text(
        "SELECT a.application_name, a.pid, a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = CAST(:s AS oid) "
        "AND l.objid = CAST(:k AS oid) AND l.objsubid = 2 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"),
        {"s": space, "k": key}).first()
    if row is None:
        return None
    name, pid, address = row
    return f"{name or 'a process without a name'} (PostgreSQL backend {pid}{f' from {address}' if address else ''})"


@contextmanager
def advisory(engine: Engine, space: int, key: int, what: str,
             on_wait: Callable[[str], None] | None = None, poll_s: float = POLL_S) -> Iterator[None]:
    """Hold an advisory lock for the block, on a connection of its own labelled ``what``.

    While another process holds it, ``on_wait`` is told who (once per holder) and the lock
    is tried again every ``poll_s`` seconds; SIGINT and SIGTERM still stop the wait.
    """
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        label(connection, whoami(what))
        told = None
        while not try_lock(connection, space, key):
            who = holder(connection, space, key)
            if on_wait is not None and who is not None and who != told:
                on_wait(who)
                told = who
            time.sleep(poll_s)
        try:
            yield
        finally:
            unlock(connection, space, key)
            connection.execute(text("RESET application_name"))


@contextmanager
def file_lock(path: Path, what: str, on_wait: Callable[[str], None] | None = None,
              poll_s: float = POLL_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block; the holder's name is written
    next to it (``path.holder``) so that a waiting process can say whom it waits for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    note = path.with_name(path.name + ".holder")
    told = None
    while True:
        with flocked(path, fcntl.LOCK_EX | fcntl.LOCK_NB) as taken:
            if taken:
                note.write_text(whoami(what))
                yield
                return
        try:
            who = note.read_text().strip() or None
        except OSError:
            who = None
        if on_wait is not None and who != told:
            on_wait(who or "another process")
            told = who
        time.sleep(poll_s)


@contextmanager
def held_here(device: str) -> Iterator[None]:
    """Note that this process holds ``device``'s lock (a worker around its job)."""
    with _held_lock:
        _held_here[device] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held_here[device] -= 1


def device_lock(engine: Engine, device: str, what: str, lock_dir: Path,
                on_wait: Callable[[str], None] | None = None, poll_s: float = POLL_S):
    """The lock that keeps two measurements off ``device``, for the measuring phase.

    PostgreSQL: the advisory lock that queue workers take for the device (one namespace, one
    key per device name, for every process on the database). SQLite: a file lock under
    ``lock_dir``. A process that holds the device already (a worker) goes straight on.
    """
    with _held_lock:
        mine = _held_here[device] > 0
    if mine:
        return _nothing()
    if engine.dialect.name == "postgresql":
        return _marked(device, advisory(engine, DEVICE_LOCK, lock_key(device), what, on_wait, poll_s))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in device)[:64]
    return _marked(device, file_lock(lock_dir / f"device-{safe}-{lock_key(device):08x}.lock", what, on_wait, poll_s))


@contextmanager
def _marked(device: str, lock) -> Iterator[None]:
    with lock, held_here(device):
        yield


@contextmanager
def _nothing() -> Iterator[None]:
    yield
