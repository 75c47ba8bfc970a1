"""Several abwatch processes on one database and one cache: none fails, nothing is stored twice.

The processes are the real ``abwatch`` command started with subprocess, on a real PostgreSQL
database (and SQLite where the same guarantee is claimed), building and timing the real C
benchmark of the test repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import git
import pytest
from sqlalchemy import func, select, text

from abwatch.core.commit_info import CommitInfo
from abwatch.service.compare import noise
from abwatch.service.store import db, locks
from abwatch.service.store.models import (
    Build, Comparison, Commit, Device, NoiseProfile, Regression, RegressionEvent, Repository, Run, RunStatus, RunType, Workload,
)
from abwatch.service.stats.verdict import RegressionState
from abwatch.builders.repo import RepoMirror
from abwatch.service import stats
from abwatch.service.stats import Outcome
from abwatch.service.store.rows import get_commit, get_repository, get_workload
from tests.test_compare import compare

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

ABWATCH = [sys.executable, "-m", "abwatch.service.cli.main"]
FAILURE_WORDS = ("Traceback", "UniqueViolation", "IntegrityError", "already exists", "internal error",
                 "database error", "deadlock")


def _start(args: list, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*ABWATCH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})


def _finish(procs: list[subprocess.Popen], timeout_s: float = 600) -> list[tuple[int, str, str]]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        results.append((proc.returncode, out, err))
    return results


def _count(url: str, model, *where) -> int:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.scalar(select(func.count()).select_from(model).where(*where))
    finally:
        engine.dispose()


def _config(path: Path, repo: Path, cache: Path, *, command: str = '["./bench", "10"]', repetitions: int = 10) -> Path:
    path.write_text(f"""
cache_dir = {json.dumps(str(cache))}
[repo]
url = {json.dumps(str(repo))}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
kind = "command"
command = {command}
[run]
repetitions = {repetitions}
warmup = 1
timeout_s = 30
seed = 7
noise_aware = false
max_repetitions = 40
[stats]
threshold_pct = 5.0
""")
    return path


def _in_threads(target, arguments: list[tuple]) -> None:
    """``target`` called once with each of ``arguments``, each call in a thread of its own, all
    started before any is waited for."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_three_compares_at_once_on_one_database_and_one_empty_cache(empty_pg_url, bench_repo, tmp_path):
    """The operator's report: UniqueViolation on the first migration and on workloads/repositories,
    and a clone race on an empty cache. Three at once, with the pair in both orders."""
    config = _config(tmp_path / "abwatch.toml", bench_repo, tmp_path / "cache")
    pairs = [("base", "noop"), ("noop", "base"), ("base", "noop")]
    procs = [_start(["compare", "--config", config, "--control", c, "--treatment", t, "--json", "--db", empty_pg_url])
             for c, t in pairs]
    results = _finish(procs)
    for code, out, err in results:
        # 0 or 1 are verdicts (the machine may be noisy); anything else is a failure of abwatch
        assert code in (0, 1), err
        assert not any(word in err for word in FAILURE_WORDS), err
        assert json.loads(out)["status"] == "completed"
    assert _count(empty_pg_url, Run) == 3
    assert _count(empty_pg_url, Run, Run.status == RunStatus.RUNNING) == 0
    assert _count(empty_pg_url, Repository) == 1
    assert _count(empty_pg_url, Commit) == 2
    assert _count(empty_pg_url, Device) == 1
    assert _count(empty_pg_url, Workload) == 1
    # one row per artifact, whoever built it and whoever found it in the cache
    assert _count(empty_pg_url, Build) == 2
    assert _count(empty_pg_url, Comparison) == 3
    mirrors = list((tmp_path / "cache" / "repos").glob("*.git"))
    assert len(mirrors) == 1 and not list((tmp_path / "cache" / "repos").glob("*.tmp"))


def test_two_verifies_of_one_regression_move_it_once(write_config, fresh_pg_url, capsys, monkeypatch):
    monkeypatch.setenv("FLAKY_SLOWDOWN", "1.3")
    config = write_config(repetitions=6, run_extra="max_repetitions = 30\nverify_factor = 2.0")
    code, first, err = compare(capsys, config, fresh_pg_url, "base", "flaky")
    assert code == 1, err
    results = _finish([_start(["verify", first["run_id"], "--json", "--db", fresh_pg_url]) for _ in range(2)])
    for code, _, err in results:
        assert code in (0, 1), err
        assert not any(word in err for word in FAILURE_WORDS), err
    # one verify took it; the other found it taken (or, if it came later, nothing left to verify)
    assert sum("nothing to verify" in err for _, _, err in results) == 1, [err for _, _, err in results]
    engine = db.make_engine(fresh_pg_url)
    with db.session_scope(engine) as session:
        [regression] = session.scalars(select(Regression)).all()
        events = [(e.from_state, e.to_state) for e in regression.events]
        assert events[:2] == [(None, RegressionState.BENCHMARK), (RegressionState.BENCHMARK, RegressionState.VERIFY)]
        assert len(events) == 3 and events[2][0] == RegressionState.VERIFY
        assert events[2][1] in (RegressionState.REGRESS, RegressionState.CLEARED)
        verifies = list(session.scalars(select(Run).where(Run.run_type == RunType.VERIFY)))
        assert [r.status for r in verifies].count(RunStatus.COMPLETED) == 1
        assert all(r.status in (RunStatus.COMPLETED, RunStatus.FAILED) for r in verifies)
        for loser in (r for r in verifies if r.status == RunStatus.FAILED):
            assert "another verify took it first" in loser.error
    engine.dispose()


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_migrations_at_once_on_an_empty_database(kind, request):
    url = request.getfixturevalue("empty_pg_url" if kind == "postgres" else "empty_sqlite_url")
    results = _finish([_start(["db", "upgrade", "--db", url]) for _ in range(3)])
    head = db.head_revision(url)
    for code, out, err in results:
        assert code == 0, err
        assert out.strip() == head
    engine = db.make_engine(url)
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT COUNT(*) FROM alembic_version")) == 1
    engine.dispose()


def test_get_or_create_from_many_threads_makes_one_row_each(fresh_pg_url):
    """Sixteen sessions meet the same new repository, commit and workload at the same moment."""
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    info = CommitInfo(sha="c" * 40, summary="s", author="a <a@b>", committed_at=None)
    barrier, errors, ids = threading.Barrier(16), [], set()

    def one() -> None:
        try:
            with db.session_scope(engine) as session:
                barrier.wait()
                repository = get_repository(session, "/many")
                commit = get_commit(session, repository, info)
                workload = get_workload(session, repository.id, "w", "command", {"command": ["x"]})
                ids.add((repository.id, commit.id, workload.id))
        except Exception as exc:  # collected: an assertion in a thread would go unseen
            errors.append(exc)

    _in_threads(one, [()] * 16)
    assert errors == [] and len(ids) == 1
    assert (_count(fresh_pg_url, Repository), _count(fresh_pg_url, Commit), _count(fresh_pg_url, Workload)) == (1, 1, 1)
    engine.dispose()


def test_noise_profiles_lose_no_update(fresh_pg_url):
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    with db.session_scope(engine) as session:
        repository = get_repository(session, "/noise")
        workload_id = get_workload(session, repository.id, "w", "command", {}).id
        session.add(Device(name="d", kind="cpu", hardware_config={}))
        session.flush()
        device_id = session.scalar(select(Device.id))
    samples = {"control": [1.0, 1.1, 1.0, 1.2, 0.9, 1.0], "treatment": [1.0, 1.05, 1.1, 0.95, 1.0, 1.1]}
    groups = {"control": [0, 0, 1, 1, 2, 2], "treatment": [0, 0, 1, 1, 2, 2]}
    barrier, errors = threading.Barrier(12), []

    def one(same: bool) -> None:
        try:
            with db.session_scope(engine) as session:
                barrier.wait()
                # half of them runs that were not `same`: a lesson (a TVM workload's counts), no noise
                noise.learn(session, workload_id, device_id, samples, groups, configured_samples=3, same=same)
        except Exception as exc:
            errors.append(exc)

    _in_threads(one, [(i % 2 == 0,) for i in range(12)])
    assert errors == []
    with db.session_scope(engine) as session:
        [profile] = session.scalars(select(NoiseProfile)).all()
        assert (profile.observations, profile.lessons) == (6, 12)
        # the noise of the six `same` ones alone, whichever came first
        expected = sum(stats.process_cv(samples[side], groups[side]) for side in samples) / 2
        assert profile.process_cv == pytest.approx(expected)
    engine.dispose()


def test_a_forked_workloads_servers_share_is_a_mean_over_its_runs_that_loses_none(fresh_pg_url):
    """Twelve runs' fork-server shares folded at once, each in its one statement: the profile
    holds their mean over all twelve (fewer than noise.MEMORY, so weighed alike, whatever the
    order), which ``earlier_share`` gives with its weight; a run with no share measured (not
    forked) leaves it as it was; past MEMORY runs the history weighs as MEMORY, and a new run
    moves the mean by its 1 / (MEMORY + 1)."""
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    with db.session_scope(engine) as session:
        workload_id = get_workload(session, get_repository(session, "/share").id, "w", "tvm", {}).id
        session.add(Device(name="d", kind="cpu", hardware_config={}))
        session.flush()
        device_id = session.scalar(select(Device.id))
    shares = [i / 20 for i in range(12)]
    barrier, errors = threading.Barrier(len(shares)), []

    def one(share: float) -> None:
        try:
            with db.session_scope(engine) as session:
                barrier.wait()
                noise._fold(session, workload_id, device_id, None, {"children": 2}, share)
        except Exception as exc:
            errors.append(exc)

    _in_threads(one, [(share,) for share in shares])
    assert errors == []
    with db.session_scope(engine) as session:
        share, runs = noise.earlier_share(session, workload_id, device_id)
        assert runs == 12 and share == pytest.approx(sum(shares) / 12)
        noise._fold(session, workload_id, device_id, None, {})  # a lesson that measured no share
    with db.session_scope(engine) as session:
        assert noise.earlier_share(session, workload_id, device_id) == (pytest.approx(sum(shares) / 12), 12)
        [profile] = session.scalars(select(NoiseProfile)).all()
        assert (profile.lessons, profile.process_cv) == (13, None)
        for _ in range(noise.MEMORY - 12):  # the history at MEMORY runs, the mean unchanged
            noise._fold(session, workload_id, device_id, None, {}, sum(shares) / 12)
        noise._fold(session, workload_id, device_id, None, {}, 1.0)
        share, runs = noise.earlier_share(session, workload_id, device_id)
        assert runs == noise.MEMORY and profile.server_share_runs == noise.MEMORY + 1
        assert share == pytest.approx((sum(shares) / 12 * noise.MEMORY + 1.0) / (noise.MEMORY + 1))
    engine.dispose()


def test_mirror_is_cloned_once_by_processes_that_start_together(bench_repo, tmp_path):
    """Three clones of an empty cache at once: each waits for the first instead of racing on its
    temporary directory (``destination path ... .tmp already exists``)."""
    script = ("import sys; from pathlib import Path; from abwatch.builders.repo import RepoMirror; "
              "m = RepoMirror(sys.argv[1], Path(sys.argv[2])); m.fetch(); print(m.resolve('slower').sha)")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(bench_repo), str(tmp_path / "cache")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = _finish(procs)
    expected = git.Repo(bench_repo).commit("slower").hexsha
    assert [(code, out.strip()) for code, out, _ in results] == [(0, expected)] * 3, [e for *_, e in results]
    assert [p.name for p in (tmp_path / "cache" / "repos").iterdir() if p.suffix != ".lock"] \
        == [RepoMirror(str(bench_repo), tmp_path / "cache").path.name]


@pytest.mark.parametrize("kind", ["postgres", "sqlite"])
def test_a_busy_device_makes_the_measuring_phase_wait_and_says_who_holds_it(kind, request, write_config, tmp_path):
    """Held by someone else (here: the test, named like a run), the device keeps a compare from
    measuring; the compare says who holds it, builds meanwhile, and measures once it is free."""
    url = request.getfixturevalue("fresh_pg_url" if kind == "postgres" else "sqlite_url")
    config = write_config(repetitions=4, run_extra="max_repetitions = 8")
    db.upgrade(url)
    engine = db.make_engine(url)
    import socket

    device = socket.gethostname()  # the cpu runner's device name
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with locks.device_lock(engine, device, "abwatch run 999", tmp_path / "cache" / "locks"):
            held.set()
            release.wait(300)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(60)
    proc = _start(["compare", "--config", config, "--control", "base", "--treatment", "noop", "--json", "--db", url])
    try:
        deadline = time.monotonic() + 300
        # the run exists and its builds are stored, but not one invocation while the device is held
        while _count(url, Run, Run.treatment_build_id.is_not(None)) == 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        time.sleep(3)
        from abwatch.service.store.models import Invocation

        assert _count(url, Invocation) == 0
    finally:
        release.set()
        holder.join()
    code, out, err = _finish([proc])[0]
    assert code in (0, 1), err
    assert f"device {device} is busy, measured by abwatch run 999 {socket.gethostname()}:{os.getpid()}" in err
    assert json.loads(out)["status"] == "completed"
    engine.dispose()


def test_rerunning_a_pair_does_not_open_a_second_regression(session):
    from abwatch.service.compare import lifecycle

    repository = get_repository(session, "/rerun")
    a = get_commit(session, repository, CommitInfo("a" * 40, "", "", None))
    b = get_commit(session, repository, CommitInfo("b" * 40, "", "", None))
    workload = get_workload(session, repository.id, "w", "command", {})
    device = Device(name="rerun-device", kind="cpu", hardware_config={})
    session.add(device)
    session.flush()
    opened = []
    for _ in range(2):
        run = Run(run_type=RunType.BENCHMARK, status=RunStatus.COMPLETED, repository_id=repository.id,
                  control_ref="a", treatment_ref="b", control_commit_id=a.id, treatment_commit_id=b.id,
                  device_id=device.id, seed=1)
        session.add(run)
        session.flush()
        comparison = Comparison(run_id=run.id, workload_id=workload.id, verdict=Outcome.REGRESSION,
                                change_pct=9.0, control_n=5, treatment_n=5, details={})
        session.add(comparison)
        session.flush()
        opened.append(lifecycle.open_regression(session, run, comparison))
    assert opened[0].id == opened[1].id
    assert session.scalar(select(func.count()).select_from(RegressionEvent)
                          .where(RegressionEvent.regression_id == opened[0].id)) == 1
    # once it is closed, the same pair may be found again: a new regression
    lifecycle.transition(session, opened[0], RegressionState.VERIFY, run, "v")
    lifecycle.transition(session, opened[0], RegressionState.CLEARED, run, "c")
    assert lifecycle.open_regression(session, run, comparison).id != opened[0].id


def test_a_queue_worker_and_a_compare_share_the_device_lock(write_config, fresh_pg_url):
    """A worker running a job holds its device (the queue's advisory lock); a compare on the same
    device waits for the job to end and names the worker, and the worker's own job is never made
    to wait for itself (its compares measure under the lock the worker holds)."""
    import socket

    from abwatch.service.watch import queue
    from abwatch.service.store.models import Invocation

    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    device = socket.gethostname()
    with db.session_scope(engine) as session:
        queue.enqueue(session, "hold", device, {}, "hold-1")
    release, running, inside = threading.Event(), threading.Event(), []

    def hold(session, job) -> dict:
        running.set()
        # what a job's compare does: take the device's measuring lock, held by this worker already
        with locks.device_lock(engine, device, "abwatch run 0", Path("/nonexistent")):
            inside.append(True)
        release.wait(300)
        return {}

    worker = queue.Worker(engine, device, {"hold": hold})
    thread = threading.Thread(target=worker.run_one)
    thread.start()
    assert running.wait(60)
    config = write_config(repetitions=4, run_extra="max_repetitions = 8")
    proc = _start(["compare", "--config", config, "--control", "base", "--treatment", "noop", "--json",
                   "--db", fresh_pg_url])
    try:
        deadline = time.monotonic() + 300
        while _count(fresh_pg_url, Run, Run.treatment_build_id.is_not(None)) == 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.3)
        time.sleep(3)
        assert _count(fresh_pg_url, Invocation) == 0
    finally:
        release.set()
        thread.join()
        worker.close()
    code, out, err = _finish([proc])[0]
    assert inside == [True]
    assert code in (0, 1), err
    assert f"device {device} is busy, measured by abwatch worker {worker.name}" in err
    assert json.loads(out)["status"] == "completed"
    engine.dispose()


def test_a_stop_interrupts_a_jobs_handler_but_not_the_writing_of_its_outcome(fresh_pg_url):
    """SIGTERM during a job's handler queues the job again and stops the worker (130); one that
    comes while the worker writes a finished job's outcome (the job already done, its session
    still closing: what a busy host's deploy saw) only ends the loop after it."""
    import signal

    from sqlalchemy import event

    from abwatch.service.store.models import Job, JobStatus
    from abwatch.service.watch import queue
    from abwatch.service.watch.daemon import Stopper

    engine = db.make_engine(fresh_pg_url)
    with db.session_scope(engine) as session:
        queue.enqueue(session, "quick", "dev", {}, "quick-1")
        queue.enqueue(session, "stopped", "dev", {}, "stopped-1")

    def stopped(session, job) -> dict:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next instruction: this sleep is cut short
        return {}

    worker = queue.Worker(engine, "dev", {"quick": lambda session, job: {"ran": True}, "stopped": stopped})
    stopper, before = Stopper(), (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    stopper.workers.append(worker)
    outcome_commits: list[int] = []

    def signal_as_it_commits(session) -> None:  # the outcome's commit, not the claim's
        if any(isinstance(o, Job) and o.status == JobStatus.DONE for o in session.identity_map.values()):
            outcome_commits.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    event.listen(worker.factory, "after_commit", signal_as_it_commits)
    stopper.install()
    try:
        try:
            done = worker.run_one()
        except KeyboardInterrupt as exc:  # failed, rather than pytest's own stop
            pytest.fail(f"a stop while a done job's outcome was written interrupted it: {exc!r}")
        assert done is not None and stopper.stopping and outcome_commits == [1]
        stopper.event.clear()
        with pytest.raises(KeyboardInterrupt):
            worker.run_one()
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
        worker.close()
    with db.session_scope(engine) as session:
        jobs = {job.kind: job for job in session.scalars(select(Job))}
        assert jobs["quick"].status == JobStatus.DONE and jobs["quick"].result == {"ran": True}
        assert jobs["stopped"].status == JobStatus.QUEUED and "was stopped; queued again" in jobs["stopped"].error
    engine.dispose()
