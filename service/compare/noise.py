"""Noise awareness: learn each (workload, device)'s process-to-process noise from its `same`
verdicts, and start the next run with as many invocations as that noise needs."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table, case, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from abwatch.service import stats
from abwatch.service.config import Config
from abwatch.service.store.models import NoiseProfile, utcnow

MIN_START = 4  # fewer processes than this cannot give a useful first look
MAX_START_FACTOR = 3  # a very noisy history starts at most this many times run.repetitions
MEMORY = 20  # observations a profile averages over before it starts to follow drift


def starting_repetitions(session: Session, config: Config, workload_id: int, device_id: int | None,
                         floor: int | None = None) -> tuple[int, str]:
    """Invocations per side for the first look, and why that many."""
    default = config.run.repetitions
    profile = None
    if config.run.noise_aware and device_id is not None:
        # read afresh: learn() writes with one UPDATE statement, past the session's copies
        profile = session.scalar(select(NoiseProfile).where(
            NoiseProfile.workload_id == workload_id, NoiseProfile.device_id == device_id)
            .execution_options(populate_existing=True))
    if profile is None:
        return default, f"{default} invocations a side (configured; no noise history)"
    # the interval decides a regression, so plan at its level; the sequence may look any
    # number of times, so a small start costs nothing but looks
    planned = stats.planned_repetitions(profile.process_cv, config.stats.target_pct,
                                        1.0 - config.stats.confidence, config.stats.power)
    most = config.run.max_repetitions or MAX_START_FACTOR * config.run.repetitions
    start = min(most, max(planned, MIN_START, floor or 0))
    return start, (f"{start} invocations a side (process noise {profile.process_cv:.2%} from "
                   f"{profile.observations} past run(s) needs {planned} for {config.stats.target_pct:g}%)")


def learn(session: Session, workload_id: int, device_id: int | None, samples: dict, groups: dict) -> None:
    """Fold the noise of an A/A-like (``same``) comparison into the profile."""
    if device_id is None:
        return
    try:
        cv = sum(stats.process_cv(samples[side], groups[side]) for side in samples) / len(samples)
    except ValueError:
        return
    # One statement that reads and writes the row: two runs that finish at once both count
    # (a read-then-write in Python would lose one of them).
    table = cast(Table, NoiseProfile.__table__)
    dialect = session.get_bind().dialect.name
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(
        workload_id=workload_id, device_id=device_id, process_cv=cv, observations=1, updated_at=utcnow())
    weight = case((table.c.observations < MEMORY, table.c.observations), else_=MEMORY)
    session.execute(statement.on_conflict_do_update(
        index_elements=["workload_id", "device_id"],
        set_={"process_cv": (table.c.process_cv * weight + statement.excluded.process_cv) / (weight + 1),
              "observations": table.c.observations + 1,
              "updated_at": statement.excluded.updated_at}))
    session.flush()
