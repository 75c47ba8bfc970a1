"""Build jobs' claims across hosts on a real PostgreSQL: each host is an engine of its own (its
own connections), as each host's process has."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from abwatch.service.store import build_jobs, db, locks
from abwatch.service.store.jobs import JobStatus
from abwatch.service.store.locks import JOB_LOCK


def test_a_claim_given_back_or_done_leaves_no_lock_behind_in_a_living_process(fresh_pg_url):
    """A host that gives a build job back (its build was interrupted) or finishes it lives on,
    its connection back in its pool: the job's lock must go with the claim, else no other host
    could claim the job given back while this process lives."""
    first, second = db.make_engine(fresh_pg_url), db.make_engine(fresh_pg_url)
    try:
        with Session(first) as session:
            build_jobs.enqueue(session, "a" * 40, "key-a")
            session.commit()
        claim = build_jobs.claim(first, "key-a")
        assert claim is not None
        assert build_jobs.claim(second, "key-a") is None  # held: the other host waits
        claim.finish(JobStatus.QUEUED, error="interrupted")
        with second.connect() as connection:
            assert locks.holder(connection, JOB_LOCK, claim.job_id) is None
        again = build_jobs.claim(second, "key-a")  # the other host takes it while the first lives
        assert again is not None and again.job_id == claim.job_id
        again.finish(JobStatus.DONE, {"status": "success"})
        with first.connect() as connection:
            assert locks.holder(connection, JOB_LOCK, claim.job_id) is None
            status = connection.execute(text("SELECT status, attempts FROM jobs WHERE id = :i"),
                                        {"i": claim.job_id}).one()
        assert tuple(status) == ("done", 2)
        with Session(second) as session:
            assert build_jobs.status(session, "key-a") == (claim.job_id, JobStatus.DONE)
    finally:
        first.dispose()
        second.dispose()
