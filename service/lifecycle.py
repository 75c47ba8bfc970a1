"""The life of a regression: benchmark (suspected) -> verify -> regress (confirmed), or cleared.

Every change of state is a :class:`~service.models.RegressionEvent` with its time, the
run that caused it and the reason; only the transitions in :data:`TRANSITIONS` exist.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.models import Comparison, Regression, RegressionEvent, RegressionState, Run, utcnow

S = RegressionState

TRANSITIONS: dict[RegressionState | None, frozenset[RegressionState]] = {
    None: frozenset({S.BENCHMARK}),
    S.BENCHMARK: frozenset({S.VERIFY}),
    # Back to BENCHMARK when the verify run could not judge (its build failed, it hung).
    S.VERIFY: frozenset({S.REGRESS, S.CLEARED, S.BENCHMARK}),
    S.REGRESS: frozenset({S.FIXED}),  # a later commit brought the workload back
    S.FIXED: frozenset(),
    S.CLEARED: frozenset(),
}


class TransitionError(Exception):
    """A state change the lifecycle does not allow."""


def transition(session: Session, regression: Regression, to_state: RegressionState,
               run: Run | None, reason: str) -> RegressionEvent:
    """Move ``regression`` to ``to_state`` and record the event."""
    from_state = regression.state
    if to_state not in TRANSITIONS[from_state]:
        raise TransitionError(
            f"regression {regression.id}: cannot go from {from_state.value} to {to_state.value}"
        )
    now = utcnow()
    regression.state = to_state
    regression.updated_at = now
    event = RegressionEvent(
        regression=regression, from_state=from_state, to_state=to_state,
        run_id=run.id if run else None, reason=reason, at=now,
    )
    session.add(event)
    session.flush()
    return event


def open_regression(session: Session, run: Run, comparison: Comparison, kind: str = "speed",
                    reason: str | None = None) -> Regression:
    """Store a suspected regression found by ``run`` (state ``benchmark``); ``kind`` is
    ``speed`` or ``correctness``."""
    now = utcnow()
    regression = Regression(
        workload_id=comparison.workload_id,
        device_id=run.device_id,
        control_commit_id=run.control_commit_id,
        treatment_commit_id=run.treatment_commit_id,
        run_id=run.id,
        comparison_id=comparison.id,
        state=S.BENCHMARK,
        kind=kind,
        change_pct=comparison.change_pct or 0.0,
        created_at=now,
        updated_at=now,
    )
    session.add(regression)
    session.flush()
    session.add(RegressionEvent(
        regression=regression, from_state=None, to_state=S.BENCHMARK, run_id=run.id, at=now,
        reason=f"{run.run_type.value} run {run.id}: {reason or comparison.details.get('reason', 'slower')}",
    ))
    session.flush()
    return regression


def pending_for_run(session: Session, run_id: int) -> list[Regression]:
    """The speed regressions found by ``run_id`` that still wait for verification."""
    return list(session.scalars(
        select(Regression)
        .where(Regression.run_id == run_id, Regression.state == S.BENCHMARK, Regression.kind == "speed")
        .order_by(Regression.id)
    ))
