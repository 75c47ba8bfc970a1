"""History: per-commit series from stored records, and the commit a step starts at."""

from __future__ import annotations

from datetime import datetime, timedelta, UTC

import numpy as np

from abwatch.service.read import history
from abwatch.service.store.models import Commit, Record, Repository, Run, RunStatus, RunType
from abwatch.service.stats import change_points


def test_change_points_find_a_step_and_ignore_noise():
    rng = np.random.default_rng(0)
    flat = list(10 * rng.lognormal(0, 0.01, 40))
    assert change_points(flat) == []
    stepped = flat[:25] + [v * 1.08 for v in flat[25:]]
    [step] = change_points(stepped)
    assert step.index == 25 and 6.0 < step.change_pct < 10.0 and step.p_value < 0.001


def test_series_and_steps_from_stored_records(session):
    repo = Repository(url="/history-repo")
    session.add(repo)
    session.flush()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    commits = [Commit(repository_id=repo.id, sha=f"{i:040x}", summary=f"commit {i}",
                      committed_at=t0 + timedelta(days=i)) for i in range(30)]
    session.add_all(commits)
    session.flush()
    run = Run(run_type=RunType.BENCHMARK, status=RunStatus.COMPLETED, repository_id=repo.id,
              control_ref="a", treatment_ref="b", control_commit_id=commits[0].id,
              treatment_commit_id=commits[1].id, seed=1)
    session.add(run)
    session.flush()
    rng = np.random.default_rng(1)
    for i, commit in reversed(list(enumerate(commits))):  # stored out of order on purpose
        median = (10.0 if i < 18 else 11.0) * rng.lognormal(0, 0.005)
        for device in ("board-a", "board-b"):
            session.add(Record(run_id=run.id, workload="resnet-18", engine="tvm", engine_version=commit.sha,
                               hardware=device, runtime_ms_mean=median, runtime_ms_std=0.1, timestamp=1.0,
                               schema_version="0.1",
                               fields={"metrics": {"runtime_ms_median": median if device == "board-a" else 5.0}}))
    session.flush()
    points = history.series(session, "resnet-18", "board-a")
    assert [p.sha for p in points] == [c.sha for c in commits]
    [step] = history.steps(points)
    assert step.last_before.sha == commits[17].sha and step.first_after.sha == commits[18].sha
    assert 8.0 < step.change_pct < 12.0
    assert history.steps(history.series(session, "resnet-18", "board-b")) == []
    assert history.series(session, "no-such-workload") == []


def test_commits_of_the_same_second_follow_the_runs_that_compared_them(session):
    # a rebased stack: three commits, one committer second; their shas sort against their order
    repo = Repository(url="/same-second")
    session.add(repo)
    session.flush()
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    oldest, middle, newest, unrelated = (Commit(repository_id=repo.id, sha=sha, summary=sha[:1], committed_at=when)
                                         for sha in ("f" * 40, "b" * 40, "a" * 40, "c" * 40))
    session.add_all([oldest, middle, newest, unrelated])
    session.flush()
    for control, treatment in ((oldest, middle), (middle, newest)):
        run = Run(run_type=RunType.BENCHMARK, status=RunStatus.COMPLETED, repository_id=repo.id,
                  control_ref=control.sha, treatment_ref=treatment.sha, control_commit_id=control.id,
                  treatment_commit_id=treatment.id, seed=1)
        session.add(run)
        session.flush()
        for commit in (control, treatment, unrelated):
            session.add(Record(run_id=run.id, workload="stack", engine="tvm", engine_version=commit.sha,
                               hardware="cpu", runtime_ms_mean=1.0, runtime_ms_std=0.1, timestamp=1.0,
                               schema_version="0.1", fields={"metrics": {"runtime_ms_median": 1.0}}))
    session.flush()
    # control before treatment, transitively; of the commits ready together, the lower sha first
    assert [p.sha for p in history.series(session, "stack")] == [unrelated.sha, oldest.sha, middle.sha, newest.sha]
