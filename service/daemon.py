"""``abwatch watch`` and ``abwatch worker``: the loops around :mod:`service.watch` and :mod:`service.queue`.

The long-running watch is an APScheduler ``BlockingScheduler`` with one job: a pass (poll,
queue) followed by working the queued jobs of the watch's devices. Its trigger is a cron
trigger for ``[watch] schedule`` (nightly mode) or an interval trigger of ``interval_s``,
both in ``[watch] timezone``. The scheduler's jobs live in memory and are rebuilt from the
config at start (nothing of APScheduler's is stored in the database). ``max_instances=1``
and ``coalesce`` keep a slow pass from overlapping the next tick.
"""

from __future__ import annotations

import signal
import threading

from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from abwatch.service import queue, watch
from abwatch.service.config import Config
from abwatch.service.driver import NullProgress, Progress

EXIT_OK, EXIT_REGRESSION = 0, 1


def once(engine: Engine, config: Config, *, work: bool = True, progress: Progress | None = None) -> int:
    """One pass and the jobs it made (on this process's devices); 1 if a regression was confirmed."""
    progress = progress or NullProgress()
    with Session(engine, expire_on_commit=False) as session:
        report = watch.poll(session, config)
    for device, sha in report.queued:
        progress.message(f"queued {sha[:12]} for {device}")
    if not work:
        return EXIT_OK
    confirmed = []
    for device in watch.device_names(config):
        worker = queue.Worker(engine, device, watch.handlers(config, progress))
        try:
            while (job := worker.run_one()) is not None:
                result = (job_result(engine, job.id) or {})
                confirmed += result.get("confirmed", [])
                progress.message(f"job {job.id} ({result.get('sha', '?')[:12]}): {result.get('status', 'failed')}")
        finally:
            worker.close()
    return EXIT_REGRESSION if confirmed else EXIT_OK


def job_result(engine: Engine, job_id: int) -> dict | None:
    """The stored result of a finished job."""
    with Session(engine) as session:
        job = session.get(queue.Job, job_id)
        return job.result if job is not None else None


def trigger(config: Config):
    """The APScheduler trigger of a watch: cron for ``schedule``, else every ``interval_s``."""
    if config.watch.schedule:
        return CronTrigger.from_crontab(config.watch.schedule, timezone=config.watch.timezone)
    return IntervalTrigger(seconds=config.watch.interval_s, timezone=config.watch.timezone)


def forever(engine: Engine, config: Config, *, work: bool = True, progress: Progress | None = None) -> int:
    """Run passes on the watch's trigger until SIGTERM/SIGINT; the first pass runs at once."""
    from datetime import datetime, timezone

    scheduler = BlockingScheduler(timezone=config.watch.timezone)

    def tick() -> None:
        try:
            once(engine, config, work=work, progress=progress)
        except Exception as exc:  # a pass that fails (network, a bad ref) must not stop the watch
            (progress or NullProgress()).message(f"pass failed: {type(exc).__name__}: {exc}")

    # in every-commit mode the first pass starts now; in nightly mode it waits for the tick
    first = None if config.watch.schedule else datetime.now(timezone.utc)
    scheduler.add_job(tick, trigger(config), id="watch-pass", max_instances=1, coalesce=True,
                      next_run_time=first, misfire_grace_time=None)

    def stop(*_):
        threading.Thread(target=scheduler.shutdown, kwargs={"wait": False}, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheduler.start()
    return EXIT_OK


def work(engine: Engine, config: Config, device: str, *, poll_s: float = 2.0,
         progress: Progress | None = None) -> int:
    """``abwatch worker``: take this device's jobs from the queue until SIGTERM/SIGINT."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    worker = queue.Worker(engine, device, watch.handlers(config, progress))
    try:
        while not stopping.is_set():
            if worker.run_one() is None:
                stopping.wait(poll_s)
    finally:
        worker.close()
    return EXIT_OK

