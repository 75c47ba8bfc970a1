"""Regression states: only the allowed transitions, each one stored with run, time and reason."""

from __future__ import annotations

import pytest

from abwatch.service.compare import lifecycle
from abwatch.service.store.models import Comparison, Commit, Repository, Run, RunStatus, RunType, Workload
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.stats import Outcome

S = RegressionState


@pytest.fixture
def suspected(session):
    repo = Repository(url="/lifecycle")
    session.add(repo)
    session.flush()
    a, b = Commit(repository_id=repo.id, sha="a" * 40), Commit(repository_id=repo.id, sha="b" * 40)
    workload = Workload(repository_id=repo.id, name="lifecycle-w", spec_hash="h", kind="command", spec={})
    session.add_all([a, b, workload])
    session.flush()
    run = Run(run_type=RunType.BENCHMARK, status=RunStatus.COMPLETED, repository_id=repo.id,
              control_ref="a", treatment_ref="b", control_commit_id=a.id, treatment_commit_id=b.id, seed=1)
    session.add(run)
    session.flush()
    comparison = Comparison(run_id=run.id, workload_id=workload.id, verdict=Outcome.REGRESSION,
                            change_pct=7.5, control_n=10, treatment_n=10, details={"reason": "slower by 7.5%"})
    session.add(comparison)
    session.flush()
    return run, lifecycle.open_regression(session, run, comparison)


def test_open_then_verify_then_confirm(session, suspected):
    run, regression = suspected
    assert regression.state == S.BENCHMARK
    assert lifecycle.pending_for_run(session, run.id) == [regression]
    lifecycle.transition(session, regression, S.VERIFY, run, "verification started")
    lifecycle.transition(session, regression, S.REGRESS, run, "reproduced")
    session.refresh(regression)
    assert [(e.from_state, e.to_state) for e in regression.events] == [
        (None, S.BENCHMARK), (S.BENCHMARK, S.VERIFY), (S.VERIFY, S.REGRESS)]
    assert all(e.run_id == run.id and e.at is not None for e in regression.events)
    assert regression.events[-1].reason == "reproduced"
    assert lifecycle.pending_for_run(session, run.id) == []


@pytest.mark.parametrize("path", [[S.REGRESS], [S.CLEARED], [S.VERIFY, S.CLEARED, S.VERIFY]])
def test_forbidden_transitions_raise_and_change_nothing(session, suspected, path):
    run, regression = suspected
    *allowed, forbidden = path
    for state in allowed:
        lifecycle.transition(session, regression, state, run, "ok")
    state_before, events_before = regression.state, len(regression.events)
    with pytest.raises(lifecycle.TransitionError, match=f"cannot go from {state_before.value}"):
        lifecycle.transition(session, regression, forbidden, run, "not allowed")
    assert regression.state == state_before and len(regression.events) == events_before
