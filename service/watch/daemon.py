"""``abwatch watch`` and ``abwatch worker``: the loops around :mod:`service.watch.poll` and :mod:`service.watch.queue`.

The long-running watch fires passes (poll, queue, then work the queued jobs of the watch's
devices) on an APScheduler trigger: a ``CronTrigger`` for ``[watch] schedule`` (nightly mode;
5 crontab fields, or 6 with seconds first: :func:`service.config.cron_trigger`)
or an ``IntervalTrigger`` of ``interval_s``, both in ``[watch] timezone``. The triggers are
rebuilt from the config at start; nothing of APScheduler's is stored in the database.

The loop that waits for the trigger's next fire time is ours, not a ``BlockingScheduler``:
the scheduler runs its jobs in an executor thread, where SIGTERM cannot reach a running
benchmark, so ``docker stop`` would wait for a TVM build to end (or kill it without a trace).
Here the pass runs in the main thread, and so does the nightly prune of ``[retention]``
(:mod:`service.watch.retention`, on its own cron trigger). SIGTERM/SIGINT while idle stop the loop (exit 0);
during a job they interrupt it like Ctrl-C does a ``compare``: the run is marked
``interrupted``, the job goes back to the queue for the next worker, exit 130. Ticks missed
while a pass ran are coalesced into one.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from abwatch.core.redact import mask_url
from abwatch.builders.artifact_store import ArtifactStore
from abwatch.service.compare import liveness
from abwatch.service.notify import alerts
from abwatch.service.notify.channels import Destinations
from abwatch.service.store import db
from abwatch.service.watch import builds, job_kinds, presence, queue, retention, retry, poll as watch
from abwatch.service.watch.device_config import device_names
from abwatch.service.config import Config, cron_trigger
from abwatch.service.exits import EXIT_INCOMPLETE, EXIT_INTERNAL, EXIT_OK, EXIT_REGRESSION
from abwatch.service.compare.driver import NullProgress, Progress

WAKE_S = 60.0  # the idle loop looks at the clock at least this often (suspend, clock changes)
RECONNECT_MAX_S = 60.0  # longest wait between a worker's tries to reach a restarted database


class Stopper:
    """SIGTERM/SIGINT handling of the long-running loops: stop when idle, interrupt a running job."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.workers: list[queue.Worker] = []  # a signal interrupts the job one of them runs

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this (the main) thread."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.event.set()
        if any(w.current is not None for w in self.workers):
            # the run is marked interrupted, the job queued again (queue.Worker._run)
            raise liveness.Interrupted(signal.Signals(signum).name)

    @property
    def stopping(self) -> bool:
        """Whether a signal asked the loop to end."""
        return self.event.is_set()


def handlers(config: Config, progress: Progress | None = None) -> dict:
    """The job kinds a device's worker of this config runs (:data:`.job_kinds.JOB_KINDS` but the
    build queue's): ``test`` (the watch's), ``try`` (a person's) and ``pr`` (a pull request's)."""
    return job_kinds.handlers(config, progress)


def pass_exit_code(confirmed: list[int], failed: list[str], untested: list[str] | None = None) -> int:
    """The exit status of a pass: 1 when a regression was confirmed (whatever else happened),
    else 5 when the machine left a commit untested (a full disk, a missing build tool: the next
    pass retries it), else 4 when a job failed (an error, not a verdict: the pass did not do all
    it had to), else 0.

    A commit that does not build is a recorded outcome of a job that finished, not a failure.
    """
    if confirmed:
        return EXIT_REGRESSION
    if untested:
        return EXIT_INTERNAL
    return EXIT_INCOMPLETE if failed else EXIT_OK


def once(engine: Engine, config: Config, *, work: bool = True, progress: Progress | None = None,
         stopper: Stopper | None = None) -> int:
    """One pass and the jobs it made (on this process's devices): :func:`pass_exit_code`.

    Each failed job is reported by its id, device, commit and error. On PostgreSQL a job
    that another worker holds (or a device it keeps busy) is left to it.
    """
    progress = progress or NullProgress()
    stopper = stopper or Stopper()  # not installed: the CLI's SIGTERM handling stays in force
    with Session(engine, expire_on_commit=False) as session:
        report = watch.poll(session, config)
    for device, sha in report.queued:
        progress.message(f"queued {sha[:12]} for {device}")
    if not work:
        return EXIT_OK
    confirmed: list[int] = []
    failed: list[str] = []
    untested: list[str] = []  # jobs a full disk or a missing tool failed: retried by the next pass
    for device in device_names(config):
        worker = queue.Worker(engine, device, handlers(config, progress))
        stopper.workers.append(worker)
        try:
            while not stopper.stopping:
                job = worker.run_one()
                if job is None:
                    break
                send_alerts(engine, config, progress, stopper)  # the job's, and any left from earlier
                done = finished_job(engine, job.id)
                if done is None or done.status == queue.JobStatus.FAILED:
                    error = done.error if done is not None else "the job's row is gone"
                    text = f"job {job.id} on {device} (commit {job.payload.get('sha', '?')[:12]}) FAILED: {error}"
                    (untested if error and error.startswith(f"{retry.Untested.__name__}: ") else failed).append(text)
                    progress.message(text)
                    continue
                result = done.result or {}
                confirmed += result.get("confirmed", [])
                progress.message(f"job {job.id} ({result.get('sha', '?')[:12]}): {result.get('status', '?')}")
        finally:
            stopper.workers.remove(worker)
            worker.close()
    send_alerts(engine, config, progress, stopper)  # alerts earlier rounds could not deliver
    code = pass_exit_code(confirmed, failed, untested)
    if failed or untested:  # said again at the end, where a reader of a long log looks
        progress.message(f"{len(failed) + len(untested)} job(s) of this pass failed; exit {code}:\n  "
                         + "\n  ".join(failed + untested))
    return code


def send_alerts(engine: Engine, config: Config, progress: Progress, stopper: Stopper) -> None:
    """A round of the alert outbox (:func:`service.notify.alerts.deliver_pending`) between jobs, never
    during a measurement: at most ``alerts.deadline_s``, cut short by SIGTERM (what was not
    sent stays pending for the next round)."""
    if not (config.alerts.webhooks or config.github) or stopper.stopping:
        return
    for sent in alerts.deliver_pending(engine, Destinations(config.alerts, config.github), stop=stopper.event):
        what = "status" if sent.webhook.startswith("github:") else "alert"
        progress.message(f"{what} to {sent.webhook}: " + ("delivered" if sent.ok else
                                                        f"not delivered ({sent.error}); "
                                                        + ("given up" if sent.final else "a later round retries")))


def finished_job(engine: Engine, job_id: int) -> queue.Job | None:
    """The stored row of a job the worker just ran (status, result, error)."""
    with Session(engine, expire_on_commit=False) as session:
        return session.get(queue.Job, job_id)


def trigger(config: Config):
    """The APScheduler trigger of a watch: cron for ``schedule``, else every ``interval_s``."""
    if config.watch.schedule:
        return cron_trigger(config.watch.schedule, config.watch.timezone)
    return IntervalTrigger(seconds=config.watch.interval_s, timezone=config.watch.timezone)


def forever(engine: Engine, config: Config, *, work: bool = True, progress: Progress | None = None) -> int:
    """Run passes on the watch's trigger until SIGTERM/SIGINT.

    In every-commit mode the first pass runs at once; in nightly mode at the first tick.
    """
    progress = progress or NullProgress()
    ArtifactStore.from_config(config.artifacts)  # a store without its manifest key: refused at start
    stopper = Stopper()
    stopper.install()
    zone = ZoneInfo(config.watch.timezone)
    fires = trigger(config)
    now = datetime.now(zone)
    due = fires.get_next_fire_time(None, now) if config.watch.schedule else now
    progress.message(f"watching {config.repository.branch} of {mask_url(config.repository.url)}; "
                     f"{'schedule ' + config.watch.schedule if config.watch.schedule else f'every {config.watch.interval_s:g} s'}"
                     f" ({config.watch.timezone}); first pass {due.isoformat(timespec='seconds')}")
    prunes = retention.trigger(config)  # [retention]: nightly, or None (samples kept forever)
    prune_due = prunes.get_next_fire_time(None, now) if prunes is not None else None
    if prune_due is not None:
        progress.message(f"retention: raw samples of runs older than {config.retention.samples_days:g} days that "
                         f"opened nothing are pruned on {config.retention.schedule!r}; first "
                         f"{prune_due.isoformat(timespec='seconds')}")
    # the devices it works itself are registered and beat; every device is checked for silence
    served = _served(config) if work else []
    unregistered = _register(engine, config, served, progress)
    with presence.DeviceHeartbeat(engine, served, config, progress, unregistered) as heartbeat:
        while not stopper.stopping and due is not None:
            now = datetime.now(zone)
            wait = (min(d for d in (due, prune_due) if d is not None) - now).total_seconds()
            if wait > 0:
                stopper.event.wait(min(wait, WAKE_S, heartbeat.interval_s))
                if heartbeat.said.is_set():  # a device went silent (or came back): its alert goes out now
                    heartbeat.said.clear()
                    send_alerts(engine, config, progress, stopper)
                continue
            if prunes is not None and prune_due is not None and prune_due <= now:
                retention.apply(engine, config, progress, stop=lambda: stopper.stopping)
                prune_due = next_fire(prunes, prune_due, datetime.now(zone))
                continue
            try:
                once(engine, config, work=work, progress=progress, stopper=stopper)
            except Exception as exc:  # a pass that fails (network, a bad ref) must not stop the watch
                lost = db.lost_connection(exc)
                progress.message(f"pass failed: the database connection was lost ({first_line(lost)}); the next pass "
                                 "reconnects" if lost is not None else f"pass failed: {type(exc).__name__}: {exc}")
            due = next_fire(fires, due, datetime.now(zone))  # ticks missed during a long pass: one pass for all
    with contextlib.suppress(Exception):
        presence.stopped(engine, served)
    return EXIT_OK


def _served(config: Config) -> list[str]:
    """The devices a watch that works its jobs serves; none where the runner cannot name them
    (each pass says why)."""
    try:
        return device_names(config)
    except Exception:
        return []


def next_fire(fires, due: datetime | None, now: datetime) -> datetime | None:
    """The trigger's first fire time after ``now``, from ``due`` on: the ticks missed while a
    pass or a prune ran are coalesced into one."""
    while due is not None and due <= now:
        due = fires.get_next_fire_time(due, now)
    return due


def work(engine: Engine, config: Config, device: str, *, poll_s: float = 2.0,
         progress: Progress | None = None) -> int:
    """``abwatch worker``: take this device's jobs from the queue until SIGTERM/SIGINT; the device
    registered (its fingerprint) and its heartbeat beaten all the while (:mod:`.presence`)."""
    progress = progress or NullProgress()
    ArtifactStore.from_config(config.artifacts)  # a store without its manifest key: refused before any job
    stopper = Stopper()
    stopper.install()
    worker = queue.Worker(engine, device, handlers(config, progress))
    stopper.workers.append(worker)
    progress.message(f"worker {worker.name} for device {device!r}")
    try:
        unregistered = _register(engine, config, [device], progress)
        with presence.DeviceHeartbeat(engine, [device], config, progress, unregistered):
            _work_loop(engine, config, worker, stopper, progress, poll_s)
    finally:
        worker.close()
        with contextlib.suppress(Exception):  # the database gone: the heartbeat's age tells the same
            presence.stopped(engine, [device])
    return EXIT_OK


def work_builds(engine: Engine, config: Config, *, poll_s: float = 2.0, progress: Progress | None = None) -> int:
    """``abwatch worker --builds``: take build jobs until SIGTERM/SIGINT (:mod:`.builds`); the build
    hosts' heartbeat (device ``@builds``) beaten all the while, so device hosts know to wait for them."""
    progress = progress or NullProgress()
    builds.check(config)
    ArtifactStore.from_config(config.artifacts)  # a store without its manifest key: refused before any job
    stopper = Stopper()
    stopper.install()
    worker = queue.Worker(engine, builds.BUILD_QUEUE, job_kinds.handlers(config, progress, of_builds=True),
                          exclusive=False)
    stopper.workers.append(worker)
    progress.message(f"build worker {worker.name}, pushing to {mask_url(config.artifacts.store or '')}")
    try:
        presence.register(engine, builds.BUILD_QUEUE, None, None, config)
        with presence.DeviceHeartbeat(engine, [builds.BUILD_QUEUE], config, progress):
            _work_loop(engine, config, worker, stopper, progress, poll_s)
    finally:
        worker.close()
        with contextlib.suppress(Exception):
            presence.stopped(engine, [builds.BUILD_QUEUE])
    return EXIT_OK


def _register(engine: Engine, config: Config, devices: list[str], progress: Progress) -> list[str]:
    """Register the devices this process serves (:func:`.presence.register`), saying each one's
    fingerprint (a changed one starts a new series) or why it has none. The devices a database
    that is down left unregistered, which the heartbeat registers once it is back."""
    left = []
    for device in devices:
        try:
            for line in presence.register(engine, device, *presence.describe(config, device), config):
                progress.message(line)
        except Exception as exc:
            lost = db.lost_connection(exc)
            if lost is None:
                raise
            progress.message(f"device {device}: not registered ({first_line(lost)}); its heartbeat will, once "
                             "the database is back")
            left.append(device)
    return left


def _work_loop(engine: Engine, config: Config, worker: queue.Worker, stopper: Stopper, progress: Progress,
               poll_s: float) -> None:
    """The worker's loop: a job, a round of alerts, a wait when there was none; reconnects."""
    wait = 0.0
    while not stopper.stopping:
        try:
            job = worker.run_one()
            send_alerts(engine, config, progress, stopper)
        except Exception as exc:
            lost = db.lost_connection(exc)
            if lost is None:
                raise
            # a database restart: wait, reconnect and carry on (a job it ran is queued again)
            wait = min(RECONNECT_MAX_S, wait * 2 or 1.0)
            progress.message(f"database connection lost ({first_line(lost)}); reconnecting in {wait:g} s")
            worker.reconnect()
            stopper.event.wait(wait)
            continue
        if wait:
            progress.message("database connection back; reconnected")
            wait = 0.0
        if job is None:
            stopper.event.wait(poll_s)


def first_line(exc: BaseException) -> str:
    """The driver's own message of a database error, its first line (no SQL, no parameters)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
