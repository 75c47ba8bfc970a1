"""The watch's job queue under load: worker processes draining one PostgreSQL ``jobs`` table.

Enqueues ``--jobs`` jobs spread over ``--devices`` devices, starts ``--workers`` processes
(assigned to the devices in turn) that run them with ``service.watch.queue.Worker`` and a handler
that only sleeps ``--job-ms`` (a stand-in for a benchmark), and prints: the wall time, jobs
per second, the queue's own cost per job (claim, locks, reap, finish), and the checks that
must hold whatever the load: every job done once, and never two jobs at once on one device.

    python -m benchmarks.watch_queue [--jobs 400] [--devices 2] [--workers 4] [--job-ms 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import uuid

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


def _work(url: str, device: str, job_ms: float) -> None:
    """One worker process: run ``device``'s jobs until none is queued or running."""
    from abwatch.service.store import db
    from abwatch.service.watch import queue
    from abwatch.service.store.models import Job, JobStatus

    engine = db.make_engine(url)

    def handler(session, job):
        start = time.time()
        time.sleep(job_ms / 1000)
        return {"start": start, "end": time.time()}

    worker = queue.Worker(engine, device, {"noop": handler})
    try:
        while True:
            if worker.run_one() is None:
                with Session(engine) as session:
                    left = session.scalar(select(Job.id).where(
                        Job.device == device, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING])).limit(1))
                if left is None:
                    return
                time.sleep(0.002)  # the device is busy with another worker's job
    finally:
        worker.close()
        engine.dispose()


def main() -> None:
    """Run the measurement and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--job-ms", type=float, default=5.0)
    parser.add_argument("--admin-url", default=ADMIN_URL)
    args = parser.parse_args()

    from abwatch.service.store import db
    from abwatch.service.watch import queue
    from abwatch.service.store.models import Job

    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    name = f"abwatch_queue_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        db.upgrade(url)
        engine = db.make_engine(url)
        devices = [f"device-{i}" for i in range(args.devices)]
        with Session(engine) as session:
            for i in range(args.jobs):
                queue.enqueue(session, "noop", devices[i % len(devices)], {"i": i}, f"bench:{i}")
            session.commit()
        context = multiprocessing.get_context("spawn")
        procs = [context.Process(target=_work, args=(url, devices[i % len(devices)], args.job_ms))
                 for i in range(args.workers)]
        started = time.perf_counter()
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        wall = time.perf_counter() - started
        with Session(engine) as session:
            jobs = list(session.scalars(select(Job)))
        done = [j for j in jobs if j.status.value == "done"]
        twice = [j.id for j in jobs if j.attempts != 1]
        overlaps = 0
        for device in devices:
            spans = sorted((j.result["start"], j.result["end"]) for j in done if j.device == device)
            overlaps += sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])
        per_device = max(sum(1 for j in jobs if j.device == d) for d in devices)
        busy = per_device * args.job_ms / 1000  # the least time the busiest device needs
        # from the first job's start to the last one's end: process start-up left out
        span = max(j.result["end"] for j in done) - min(j.result["start"] for j in done)
        print(f"{args.jobs} jobs, {args.devices} devices, {args.workers} workers, {args.job_ms:g} ms a job")
        print(f"wall {wall:.2f} s with process start-up; first job to last {span:.2f} s: {args.jobs / span:.0f} jobs/s")
        print(f"queue cost per job on the busiest device: {(span - busy) / per_device * 1000:.1f} ms")
        print(f"done {len(done)}/{len(jobs)}; run more than once: {len(twice)}; overlapping on a device: {overlaps}")
        engine.dispose()
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
