"""The life of a regression: benchmark (suspected) -> verify -> regress (confirmed), or cleared.

Every change of state is a :class:`~service.store.models.RegressionEvent` with its time, the
run that caused it and the reason; only the transitions in :data:`TRANSITIONS` exist.
"""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from abwatch.service.store.models import (
    OPEN_REGRESSION_SQL, OPEN_REGRESSION_STATES, Comparison, Regression, RegressionEvent, Run, utcnow,
)
from abwatch.service.stats.verdict import Direction, Metric, RegressionState, RegressionKind
from abwatch.service.store.rows import insert_ignoring_conflict

S = RegressionState
OPEN_STATES = tuple(S(state) for state in OPEN_REGRESSION_STATES)

TRANSITIONS: dict[RegressionState | None, frozenset[RegressionState]] = {
    None: frozenset({S.BENCHMARK}),
    S.BENCHMARK: frozenset({S.VERIFY}),
    # Back to BENCHMARK when the verify run could not judge (its build failed, it hung).
    S.VERIFY: frozenset({S.REGRESS, S.CLEARED, S.BENCHMARK}),
    # FIXED: a later commit brought the workload back; CLEARED: its culprit left the branch
    # (a force-push), so no commit of the branch holds it any more (service.watch.upkeep)
    S.REGRESS: frozenset({S.FIXED, S.CLEARED}),
    S.FIXED: frozenset(),
    S.CLEARED: frozenset(),
}


class TransitionError(Exception):
    """A state change the lifecycle does not allow."""


class ConcurrentTransition(TransitionError):
    """Another process moved the regression first (it was no longer in the state this one read)."""


def lock(session: Session, regression: Regression) -> Regression:
    """Read ``regression`` again under a row lock (``SELECT ... FOR UPDATE`` on PostgreSQL).

    Until the transaction ends, another process that locks it waits, then reads the state
    this one wrote. SQLite has no row locks; the version column catches a lost race there.
    """
    session.execute(select(Regression).where(Regression.id == regression.id)
                    .with_for_update().execution_options(populate_existing=True))
    return regression


def transition(session: Session, regression: Regression, to_state: RegressionState,
               run: Run | None, reason: str, *, expect: RegressionState | None = None) -> RegressionEvent:
    """Move ``regression`` to ``to_state`` and record the event.

    The state is read again under a row lock first, so two processes cannot both take the
    same step (two verifies of one regression): the second one sees the first one's state
    and gets :class:`TransitionError`, or :class:`ConcurrentTransition` when ``expect`` (the
    state the caller acted on) is no longer the state.
    """
    lock(session, regression)
    from_state = regression.state
    if expect is not None and from_state != expect:
        raise ConcurrentTransition(f"regression {regression.id} is {from_state.value} now, not {expect.value} "
                                   "(another process moved it)")
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
    try:
        session.flush()  # the UPDATE checks the version it read: a concurrent writer fails it here
    except StaleDataError:
        session.rollback()
        raise ConcurrentTransition(f"regression {regression.id} was changed by another process "
                                   f"while this one moved it to {to_state.value}") from None
    return event


def open_regression(session: Session, run: Run, comparison: Comparison,
                    kind: RegressionKind = RegressionKind.RUNTIME,
                    reason: str | None = None, metric: Metric = Metric.TIME,
                    direction: Direction = Direction.SLOWER) -> Regression:
    """Store a suspected regression found by ``run`` (state ``benchmark``); ``kind`` is
    ``runtime``, ``compile-time`` or ``correctness``, ``metric`` the one whose verdict found it;
    ``direction`` ``faster``: a suspected improvement (verified and bisected like a regression).

    A pair, workload, device and kind has at most one open regression (a unique index over
    the open states): when one is open already (an earlier run of the same pair, or a
    concurrent one) that one is returned and nothing new is opened.
    """
    key = dict(workload_id=comparison.workload_id, device_id=run.device_id,
               control_commit_id=run.control_commit_id, treatment_commit_id=run.treatment_commit_id, kind=kind)
    now = utcnow()
    insert_ignoring_conflict(session, Regression, {
        **key, "run_id": run.id, "comparison_id": comparison.id, "state": S.BENCHMARK, "metric": metric,
        "direction": direction,
        "change_pct": comparison.change_pct or 0.0, "created_at": now, "updated_at": now, "version": 1,
    }, list(key), where=text(OPEN_REGRESSION_SQL))
    regression = session.scalars(select(Regression).filter_by(**key).where(
        Regression.state.in_(OPEN_STATES))).one()
    if regression.run_id == run.id and not regression.events:
        session.add(RegressionEvent(
            regression=regression, from_state=None, to_state=S.BENCHMARK, run_id=run.id, at=now,
            reason=f"{run.run_type.value} run {run.id}: {reason or (comparison.details.get('verdict') or comparison.details).get('reason', 'slower')}",
        ))
        session.flush()
    return regression


def note(session: Session, regression: Regression, run: Run | None, reason: str) -> RegressionEvent:
    """Record that ``run`` saw ``regression`` again: an event that keeps its state (from and to
    are the same), so its history names every later run that still shows it. Without a run it
    notes something else that happened to it (a bisection step that had to skip a commit)."""
    lock(session, regression)
    event = RegressionEvent(regression=regression, from_state=regression.state, to_state=regression.state,
                            run_id=run.id if run else None, reason=reason, at=utcnow())
    session.add(event)
    session.flush()
    return event


def open_or_attach(session: Session, run: Run, comparison: Comparison, kind: RegressionKind, verdict,
                   attach=None, reason: str | None = None, metric: Metric = Metric.TIME) -> Regression:
    """:func:`open_regression`, unless ``attach(session, run, comparison, kind, least_pct)``
    names an open regression this slowdown (``verdict``, a :class:`service.stats.Verdict`) is
    the same as: then it is :func:`note`-d there. ``least_pct`` is the lower end of the
    verdict's confidence interval (its change when it has none)."""
    change_pct = verdict.change_pct
    least = verdict.ci_pct[0] if verdict.ci_pct else change_pct
    same = attach(session, run, comparison, kind, least or 0.0) if attach is not None else None
    if same is None:
        return open_regression(session, run, comparison, kind, reason, metric)
    shown = f"{change_pct:+.2f}%" if change_pct is not None else "slower"
    note(session, same, run, f"seen again by run {run.id} ({run.treatment_commit.sha[:12]}: {shown} against "
                             f"{run.control_commit.sha[:12]}): the same regression, not opened again")
    return same


def pending_for_run(session: Session, run_id: int) -> list[Regression]:
    """The speed and compile-time regressions found by ``run_id`` that still wait for verification."""
    return list(session.scalars(
        select(Regression)
        .where(Regression.run_id == run_id, Regression.state == S.BENCHMARK,
               Regression.kind.in_((RegressionKind.RUNTIME, RegressionKind.COMPILE_TIME)))
        .order_by(Regression.id)
    ))
