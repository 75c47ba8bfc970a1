"""The ``[retention]`` policy of ``abwatch watch``: once a night (``retention.schedule``) the raw
samples of runs older than ``retention.samples_days`` that opened nothing are pruned, as
``abwatch db prune --older-than DAYS --yes`` does (:mod:`service.store.prune`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from abwatch.service.config import Config, cron_trigger
from abwatch.service.store import db, prune
from abwatch.service.compare.progress import NullProgress, Progress


def trigger(config: Config):
    """When the watch prunes (an APScheduler trigger), or None when samples are kept forever."""
    if not config.retention.samples_days:
        return None
    return cron_trigger(config.retention.schedule, config.watch.timezone)


def apply(engine: Engine, config: Config, progress: Progress | None = None,
          stop: Callable[[], bool] | None = None) -> prune.PruneResult | None:
    """Prune what the policy says may go, now; None when it keeps samples forever.

    A failure (the database gone) is said and swallowed: the watch goes on, the next night
    tries again, and whole batches already deleted stay deleted.
    """
    progress = progress or NullProgress()
    if not config.retention.samples_days:
        return None
    try:
        with Session(engine, expire_on_commit=False) as session:
            found = prune.plan(session, prune.cutoff_of(config.retention.samples_days))
            session.commit()  # the plan's reads end their transaction; each batch is its own
            if not found.runs:
                progress.message(f"retention: nothing to prune (samples_days = {config.retention.samples_days:g})")
                return prune.PruneResult(0, 0, 0.0)
            progress.message(f"retention: {prune.describe(found)}")
            done = prune.prune(session, found, progress=lambda line: progress.message(f"retention: {line}"), stop=stop)
    except Exception as exc:  # a failed prune must not stop the watch
        lost = db.lost_connection(exc)
        progress.message(f"retention: prune failed: {type(lost or exc).__name__}: {lost or exc}; the next night retries")
        return None
    progress.message(f"retention: pruned {done.samples:,} sample(s) of {done.runs:,} run(s) in {done.seconds:.1f} s")
    return done
