"""Runs that outlive their process: who runs a run, its heartbeat, and clean-up after a kill.

A run row records the host, pid and process start time of the process that runs it, and a
heartbeat that a background thread refreshes while it lives. When a command opens the
database, :func:`reap` marks every ``running`` run whose process is gone ``abandoned``:

* on the same host the answer is exact: the pid no longer exists, or belongs to a newer
  process (its start time differs);
* on another host it is the heartbeat: none for :data:`STALE_AFTER_S` seconds.

A regression left in ``verify`` by a verify run that is no longer running goes back to
``benchmark`` (an audited transition) and can be verified again.

SIGTERM is turned into :class:`Interrupted` (a ``KeyboardInterrupt``), so a run stopped by
``kill`` or by Ctrl-C ends the same way: marked ``interrupted``, what it measured kept.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from datetime import timedelta

import psutil
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from abwatch.service.compare import lifecycle
from abwatch.service.store import db
from abwatch.service.store.models import Regression, RegressionEvent, Run, RunStatus, utcnow
from abwatch.service.stats.verdict import RegressionState

LOG = logging.getLogger(__name__)
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0  # ten missed heartbeats: the process on the other host is gone


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM); handled like Ctrl-C."""


def stop_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Interrupted` in the main thread (the CLI calls this once)."""
    def handler(signum, _frame) -> None:
        raise Interrupted(signal.Signals(signum).name)

    if threading.current_thread() is threading.main_thread():  # signals are the main thread's
        signal.signal(signal.SIGTERM, handler)


def _this_process() -> tuple[str, int, float]:
    me = psutil.Process()
    return socket.gethostname(), me.pid, me.create_time()


def claim(run: Run) -> None:
    """Record on ``run`` that this process runs it, with a first heartbeat."""
    run.host, run.pid, run.process_started_at = _this_process()
    run.heartbeat_at = utcnow()


class Periodic:
    """A context manager that calls :meth:`tick` every ``interval_s`` from a daemon thread of
    its own, until the block ends. A tick that raises is skipped: a missed beat (the database
    restarting) is harmless, and the next one tries again; any other error is said once per
    kind (:meth:`failed`), so a broken beat does not go silent."""

    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._said: set[str] = set()

    def tick(self) -> None:
        """One beat (subclasses)."""

    def failed(self, exc: Exception) -> None:
        """Say that a beat failed for a reason other than a lost connection (once per kind)."""
        LOG.warning("%s: a beat failed: %s: %s", self._thread.name, type(exc).__name__, exc)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                kind = type(exc).__name__
                if db.lost_connection(exc) is None and kind not in self._said:
                    self._said.add(kind)
                    self.failed(exc)


class Heartbeat(Periodic):
    """Refreshes ``runs.heartbeat_at`` of one run every ``interval_s`` from a thread of its own.

    It writes through its own connection in its own short transactions, so the driver's
    session is never involved and never held open.
    """

    def __init__(self, engine: Engine, run_id: int, interval_s: float = HEARTBEAT_S) -> None:
        super().__init__(interval_s, f"heartbeat-run-{run_id}")
        self.engine, self.run_id = engine, run_id

    def tick(self) -> None:
        """Write the run's heartbeat."""
        with self.engine.begin() as connection:
            connection.execute(update(Run).where(Run.id == self.run_id).values(heartbeat_at=utcnow()))


def is_alive(run: Run, now=None) -> bool:
    """Whether the process that runs ``run`` still exists (see the module docstring)."""
    host, _, _ = _this_process()
    if run.host == host and run.pid is not None:
        try:
            proc = psutil.Process(run.pid)
            return abs(proc.create_time() - (run.process_started_at or 0.0)) < 1.0 \
                and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    last = run.heartbeat_at or run.started_at
    if last.tzinfo is None:  # SQLite hands back naive datetimes (stored as UTC)
        last = last.replace(tzinfo=utcnow().tzinfo)
    return (now or utcnow()) - last < timedelta(seconds=STALE_AFTER_S)


def reap(session: Session) -> list[str]:
    """Mark runs whose process died ``abandoned``; free regressions stuck in ``verify``.

    Returns one line per thing it changed (the CLI prints them). Commits its changes.
    """
    notes = []
    for run in session.scalars(select(Run).where(Run.status == RunStatus.RUNNING).with_for_update(skip_locked=True)):
        if is_alive(run):
            continue
        run.status, run.finished_at = RunStatus.ABANDONED, utcnow()
        run.error = (f"abandoned: process {run.pid} on {run.host} died without finishing the run "
                     "(killed or machine stopped); what it measured is kept")
        notes.append(f"run {run.id} marked abandoned (process {run.pid} on {run.host} is gone)")
    session.flush()
    for regression in session.scalars(select(Regression).where(Regression.state == RegressionState.VERIFY)):
        verifier = session.scalar(
            select(Run).join(RegressionEvent, RegressionEvent.run_id == Run.id)
            .where(RegressionEvent.regression_id == regression.id,
                   RegressionEvent.to_state == RegressionState.VERIFY)
            .order_by(RegressionEvent.id.desc()).limit(1)
        )
        if verifier is not None and verifier.status == RunStatus.RUNNING:
            continue
        what = f"verify run {verifier.id} ended {verifier.status.value}" if verifier else "no verify run"
        try:
            lifecycle.transition(session, regression, RegressionState.BENCHMARK, verifier,
                                 f"{what} without a verdict; back to suspected, can be verified again",
                                 expect=RegressionState.VERIFY)
        except lifecycle.TransitionError:
            continue  # another command reaped it (or a verify finished it) a moment ago
        notes.append(f"regression {regression.id} returned to benchmark ({what})")
    session.commit()
    return notes


def reap_quietly(engine: Engine) -> list[str]:
    """:func:`reap` in a session of its own; a database that refuses writes (a read-only
    role) is left as it is."""
    with Session(engine) as session:
        try:
            return reap(session)
        except DBAPIError:
            session.rollback()
            return []
