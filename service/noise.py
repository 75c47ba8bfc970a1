"""Noise awareness: learn each (workload, device)'s process-to-process noise from its `same`
verdicts, and start the next run with as many invocations as that noise needs."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service import stats
from abwatch.service.config import Config
from abwatch.service.models import NoiseProfile, utcnow

MIN_START = 4  # fewer processes than this cannot give a useful first look
MAX_START_FACTOR = 3  # a very noisy history starts at most this many times run.repetitions
MEMORY = 20  # observations a profile averages over before it starts to follow drift


def starting_repetitions(session: Session, config: Config, workload_id: int, device_id: int | None,
                         floor: int | None = None) -> tuple[int, str]:
    """Invocations per side for the first look, and why that many."""
    default = config.run.repetitions
    profile = None
    if config.run.noise_aware and device_id is not None:
        profile = session.scalar(select(NoiseProfile).where(
            NoiseProfile.workload_id == workload_id, NoiseProfile.device_id == device_id))
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
    profile = session.scalar(select(NoiseProfile).where(
        NoiseProfile.workload_id == workload_id, NoiseProfile.device_id == device_id))
    if profile is None:
        session.add(NoiseProfile(workload_id=workload_id, device_id=device_id, process_cv=cv,
                                 observations=1, updated_at=utcnow()))
    else:
        weight = min(profile.observations, MEMORY)
        profile.process_cv = (profile.process_cv * weight + cv) / (weight + 1)
        profile.observations += 1
        profile.updated_at = utcnow()
    session.flush()
