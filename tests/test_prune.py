"""Pruning raw samples (``abwatch db prune``, ``[retention]``) on real PostgreSQL and SQLite:
the dry run changes nothing, ``--yes`` deletes exactly the samples of old runs that opened
nothing, in bounded transactions, and every reader of a pruned run says so."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
import requests
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from abwatch.core.sides import Side
from abwatch.service.cli.main import main
from abwatch.service.config import Config
from abwatch.service.store import db, prune
from abwatch.service.store.base import utcnow
from abwatch.service.store.models import (
    BisectionStep, Build, BuildStatus, Commit, Comparison, Device, Invocation, InvocationStatus, Regression,
    RegressionEvent, Repository, Run, RunStatus, RunType, Sample, StepSide, StepVerdict, Workload,
)
from abwatch.service.stats.verdict import Outcome, RegressionState
from abwatch.service.watch import retention
from conftest import live_server
from tests.test_watch import write_watch_config
from tests.test_watch_workers import wait_for

SAMPLES_PER_RUN = 6  # 2 invocations (one a side) x 3 samples


def _run(session: Session, ids: dict, name: str, *, days_ago: float, status: RunStatus = RunStatus.COMPLETED,
         run_type: RunType = RunType.BENCHMARK, parent: int | None = None) -> Run:
    """A run finished ``days_ago`` days ago with one comparison, two invocations and their samples."""
    ended = utcnow() - timedelta(days=days_ago)
    run = Run(run_type=run_type, status=status, repository_id=ids["repo"], control_ref="a", treatment_ref="b",
              control_commit_id=ids["a"], treatment_commit_id=ids["b"], control_build_id=ids["build"],
              treatment_build_id=ids["build"], device_id=ids["device"], parent_run_id=parent, seed=1, config={},
              started_at=ended - timedelta(minutes=30),
              finished_at=None if status == RunStatus.RUNNING else ended)
    session.add(run)
    session.flush()
    session.add(Comparison(run_id=run.id, workload_id=ids["workload"], verdict=Outcome.SAME, change_pct=0.1,
                           ci_low_pct=-1.0, ci_high_pct=1.2, control_median_ms=10.0, treatment_median_ms=10.01,
                           control_n=3, treatment_n=3, details={}))
    for position, side in enumerate((Side.CONTROL, Side.TREATMENT)):
        invocation = Invocation(run_id=run.id, workload_id=ids["workload"], side=side, position=position,
                                status=InvocationStatus.OK, wall_s=0.05, cpu_s=0.04)
        session.add(invocation)
        session.flush()
        session.add_all(Sample(invocation_id=invocation.id, run_id=run.id, workload_id=ids["workload"], side=side,
                               order_index=k, runtime_ms=10.0 + k / 100) for k in range(3))
    ids[name] = run.id
    return run


def _regression(session: Session, ids: dict, run: Run) -> Regression:
    comparison = session.scalars(select(Comparison).where(Comparison.run_id == run.id)).one()
    regression = Regression(workload_id=ids["workload"], device_id=ids["device"], control_commit_id=ids["a"],
                            treatment_commit_id=ids["b"], run_id=run.id, comparison_id=comparison.id,
                            state=RegressionState.REGRESS, change_pct=8.0)
    session.add(regression)
    session.flush()
    return regression


def fill(url: str) -> dict[str, int]:
    """Old runs (200 days) of every kind a regression points at, an old one that opened nothing,
    an old one still running, and a recent one; their ids by name."""
    db.upgrade(url)
    engine = db.make_engine(url)
    ids: dict[str, int] = {}
    with Session(engine) as session:
        repo = Repository(url="https://example.org/r.git")
        session.add(repo)
        session.flush()
        a, b = Commit(repository_id=repo.id, sha="a" * 40), Commit(repository_id=repo.id, sha="b" * 40)
        device = Device(name="box", kind="cpu", hardware_config={})
        workload = Workload(repository_id=repo.id, name="loop", spec_hash="s", kind="command", spec={})
        session.add_all([a, b, device, workload])
        session.flush()
        build = Build(commit_id=a.id, builder="command", config_hash="c", status=BuildStatus.SUCCESS, artifact_key="k")
        session.add(build)
        session.flush()
        ids.update(repo=repo.id, a=a.id, b=b.id, device=device.id, workload=workload.id, build=build.id)
        _run(session, ids, "old_plain", days_ago=200)
        opened = _regression(session, ids, _run(session, ids, "old_opened", days_ago=200))
        verify = _run(session, ids, "old_verify", days_ago=199, run_type=RunType.VERIFY, parent=opened.run_id)
        session.add(RegressionEvent(regression_id=opened.id, from_state=RegressionState.VERIFY,
                                    to_state=RegressionState.REGRESS, run_id=verify.id, reason="reproduced"))
        # a note without a run: a NULL among the referenced run ids must not hide every run
        session.add(RegressionEvent(regression_id=opened.id, from_state=RegressionState.REGRESS,
                                    to_state=RegressionState.REGRESS, run_id=None, reason="a note"))
        # a verify run of it that stopped before it moved the regression (no event names it)
        _run(session, ids, "old_verify_unfinished", days_ago=199, run_type=RunType.VERIFY,
             status=RunStatus.INTERRUPTED, parent=opened.run_id)
        step = _run(session, ids, "old_step", days_ago=198)
        session.add(BisectionStep(regression_id=opened.id, position=0, commit_id=ids["a"], run_id=step.id,
                                  verdict=StepVerdict.SAME, side=StepSide.GOOD))
        _run(session, ids, "old_running", days_ago=200, status=RunStatus.RUNNING)
        _run(session, ids, "recent", days_ago=5)
        session.commit()
    engine.dispose()
    return ids


def samples_by_run(url: str) -> dict[int, int]:
    engine = db.make_engine(url)
    with Session(engine) as session:
        found = dict(session.execute(select(Sample.run_id, func.count()).group_by(Sample.run_id)).all())  # type: ignore[arg-type]
        pruned = {r.id: r.samples_pruned_at for r in session.scalars(select(Run))}
        kept = (session.scalar(select(func.count()).select_from(Invocation)),
                session.scalar(select(func.count()).select_from(Comparison)))
    engine.dispose()
    return {run_id: found.get(run_id, 0) for run_id in pruned} | {"pruned": pruned, "kept": kept}  # type: ignore[dict-item]


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_dry_run_reports_and_changes_nothing(db_url, capsys):
    ids = fill(db_url)
    before = samples_by_run(db_url)
    assert main(["db", "prune", "--older-than", "90", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "1 run(s) finished before" in out and f"{SAMPLES_PER_RUN} raw sample(s) of 2 invocation(s)" in out, out
    assert "4 older run(s) keep theirs" in out and "dry run: nothing was deleted" in out, out
    assert samples_by_run(db_url) == before
    assert before[ids["old_plain"]] == SAMPLES_PER_RUN


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_yes_drops_exactly_the_old_runs_that_opened_nothing(db_url, capsys):
    ids = fill(db_url)
    assert main(["db", "prune", "--older-than", "90", "--yes", "--db", db_url]) == 0
    assert f"pruned {SAMPLES_PER_RUN} sample(s) of 1 run(s)" in capsys.readouterr().out
    after = samples_by_run(db_url)
    assert after[ids["old_plain"]] == 0
    for kept in ("old_opened", "old_verify", "old_verify_unfinished", "old_step", "old_running", "recent"):
        assert after[ids[kept]] == SAMPLES_PER_RUN, kept
        assert after["pruned"][ids[kept]] is None, kept  # type: ignore[index]
    assert after["pruned"][ids["old_plain"]] is not None  # type: ignore[index]
    assert after["kept"] == (7 * 2, 7)  # every invocation (per-process summary) and verdict stays
    # a second prune finds nothing left to do
    assert main(["db", "prune", "--older-than", "90", "--yes", "--db", db_url]) == 0
    assert "pruned 0 sample(s) of 0 run(s)" in capsys.readouterr().out


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_prune_commits_in_bounded_batches(sqlite_url):
    ids = fill(sqlite_url)
    engine = db.make_engine(sqlite_url)
    lines: list[str] = []
    with Session(engine) as session:
        found = prune.plan(session, prune.cutoff_of(90))
        commits: list[int] = []
        event.listen(session, "after_commit", lambda s: commits.append(1))
        prune.PROGRESS_EVERY_S, every = 0.0, prune.PROGRESS_EVERY_S
        try:
            done = prune.prune(session, found, batch_rows=4, progress=lines.append)
        finally:
            prune.PROGRESS_EVERY_S = every
    assert (done.runs, done.samples) == (1, SAMPLES_PER_RUN)
    assert len(commits) == 2  # 4 samples, then the last 2: never all in one transaction
    assert lines and lines[-1].startswith(f"pruned {SAMPLES_PER_RUN} of {SAMPLES_PER_RUN} samples (1 of 1 runs)")
    assert samples_by_run(sqlite_url)[ids["old_plain"]] == 0
    engine.dispose()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_older_than_must_be_positive(sqlite_url, capsys):
    fill(sqlite_url)
    assert main(["db", "prune", "--older-than", "0", "--db", sqlite_url]) == 2
    assert "must be more than 0 days" in capsys.readouterr().err


@pytest.mark.slow
def test_readers_of_a_pruned_run_say_so(fresh_pg_url, tmp_path, capsys):
    ids = fill(fresh_pg_url)
    assert main(["db", "prune", "--older-than", "90", "--yes", "--db", fresh_pg_url]) == 0
    capsys.readouterr()
    assert main(["show", str(ids["old_plain"]), "--db", fresh_pg_url]) == 0
    shown = capsys.readouterr().out
    assert f"run {ids['old_plain']}: raw samples pruned" in shown and "loop" in shown, shown
    assert main(["show", str(ids["old_plain"]), "--json", "--db", fresh_pg_url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["samples_pruned_at"] and data["results"][0]["verdict"] == "same"
    assert main(["show", str(ids["recent"]), "--json", "--db", fresh_pg_url]) == 0
    assert json.loads(capsys.readouterr().out)["samples_pruned_at"] is None
    with live_server(fresh_pg_url, tmp_path / "server") as base:
        report = requests.get(f"{base}/api/runs/{ids['old_plain']}", timeout=30).json()
        assert report["samples_pruned_at"] and report["process_medians_ms"] == {}
        assert "raw samples pruned" in report["samples_note"]
        assert requests.get(f"{base}/api/runs/{ids['recent']}", timeout=30).json()["process_medians_ms"]["loop"]
        page = requests.get(f"{base}/runs/{ids['old_plain']}", timeout=30)
        assert page.status_code == 200 and 'id="samples-pruned"' in page.text and "process-chart" not in page.text
        recent = requests.get(f"{base}/runs/{ids['recent']}", timeout=30).text
        assert "process-chart" in recent and "samples-pruned" not in recent
        series = requests.get(f"{base}/api/workloads/loop/series", timeout=30)
        assert series.status_code == 200, series.text
        listed = requests.get(f"{base}/api/runs", timeout=30).json()
        assert {r["id"]: r["samples_pruned_at"] is not None for r in listed}[ids["old_plain"]]


def _config(tmp_path, **retention_keys) -> Config:
    return Config.model_validate({
        "cache_dir": str(tmp_path / "cache"), "repo": {"url": str(tmp_path / "repo")},
        "build": {"command": ["true"]}, "workloads": [{"name": "loop", "command": ["true"]}],
        "retention": retention_keys,
    })


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_retention_prunes_when_the_nightly_job_runs(db_url, tmp_path):
    ids = fill(db_url)
    engine = db.make_engine(db_url)
    forever = _config(tmp_path)
    assert retention.trigger(forever) is None and retention.apply(engine, forever) is None
    assert samples_by_run(db_url)[ids["old_plain"]] == SAMPLES_PER_RUN
    policy = _config(tmp_path, samples_days=90, schedule="0 4 * * *")
    fires = retention.trigger(policy)
    assert fires is not None and fires.get_next_fire_time(None, utcnow()).hour == 4
    done = retention.apply(engine, policy)
    assert done is not None and (done.runs, done.samples) == (1, SAMPLES_PER_RUN)
    after = samples_by_run(db_url)
    assert after[ids["old_plain"]] == 0 and after[ids["recent"]] == SAMPLES_PER_RUN
    assert after[ids["old_opened"]] == SAMPLES_PER_RUN
    engine.dispose()


def test_retention_config_is_checked(tmp_path):
    with pytest.raises(ValueError, match="samples_days"):
        _config(tmp_path, samples_days=-1)
    with pytest.raises(ValueError, match="not a cron expression"):
        _config(tmp_path, samples_days=30, schedule="nightly")


@pytest.mark.slow
def test_the_long_running_watch_prunes_on_its_retention_schedule(tmp_path, sqlite_url):
    ids = fill(sqlite_url)
    # the watch's own pass is next new year; the prune every 2 seconds
    config = write_watch_config(tmp_path, tmp_path / "repo", 'schedule = "0 0 1 1 *"\n'
                                '[retention]\nsamples_days = 90\nschedule = "*/2 * * * * *"')
    log = tmp_path / "watch.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "watch", "--config", config,
                                 "--db", sqlite_url], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("the nightly prune", lambda: "retention: pruned" in log.read_text(), deadline_s=120, logs=[log])
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 0, text
    assert f"retention: pruned {SAMPLES_PER_RUN} sample(s) of 1 run(s)" in text, text
    after = samples_by_run(sqlite_url)
    assert after[ids["old_plain"]] == 0 and after[ids["recent"]] == SAMPLES_PER_RUN
