"""The driver's parts apart: a build without a run, a caller's builder and runner, build then measure.

Real git history, real builds and real workload processes on SQLite (the small C benchmark
of ``conftest.HISTORY``); budgets are small, and no verdict is asserted (timing noise).
"""

from __future__ import annotations

from contextlib import ExitStack

from sqlalchemy import func, select

from abwatch.core.sides import Side
from abwatch.builders import CommandBuilder
from abwatch.runners import CpuRunner
from abwatch.service.compare import driver
from abwatch.service.store import db
from abwatch.service.compare.building import build_commits, build_pair
from abwatch.service.config import load_config
from abwatch.service.store.models import Build, BuildStatus, Comparison, Invocation, Run, RunStatus, RunType
from abwatch.service.store.rows import get_commit, get_device, get_repository


class CountingBuilder(CommandBuilder):
    """The command builder, counting what the driver asks of it."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.built: list[str] = []

    def build(self, sha: str):
        self.built.append(sha)
        return super().build(sha)


class CountingRunner(CpuRunner):
    """The CPU runner, counting how often it is prepared and torn down."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.prepared = self.torn_down = 0

    def prepare(self):
        self.prepared += 1
        return super().prepare()

    def teardown(self) -> None:
        self.torn_down += 1
        super().teardown()


def small_config(write_config):
    return load_config(write_config(repetitions=4, run_extra="max_repetitions = 4"))


def test_builds_apart_from_a_run_are_reused_by_the_run(write_config, sqlite_url):
    config = small_config(write_config)
    engine = db.make_engine(sqlite_url)
    db.upgrade(sqlite_url)
    with db.session_scope(engine) as session:
        built = build_commits(session, CommandBuilder(config), ["base", "slower", "broken"])
        assert [b.status for b in built] == ["success", "success", "build_failed"]
        assert not any(b.cached for b in built) and "exited with status" in built[2].message
        assert session.scalar(select(func.count()).select_from(Run)) == 0  # no run: builds only

        builder = CountingBuilder(config)
        outcome = driver.run_compare(session, config, "base", "slower", builder=builder)
        assert builder.built == [built[0].sha, built[1].sha]  # the caller's builder did the work
        # the run found both in the cache and kept the rows the builds wrote
        assert [(b.cached, b.build_id) for b in outcome.builds] == [(True, built[0].build_id),
                                                                     (True, built[1].build_id)]
        assert outcome.status in ("completed", "incomplete") and len(outcome.results) == 1
        assert session.scalar(select(func.count()).select_from(Build)) == 3


def test_a_callers_runner_is_prepared_per_run_and_left_to_its_owner(write_config, sqlite_url):
    config = small_config(write_config)
    engine = db.make_engine(sqlite_url)
    db.upgrade(sqlite_url)
    runner = CountingRunner(config.runner)
    with db.session_scope(engine) as session:
        first = driver.run_compare(session, config, "base", "noop", runner=runner)
        second = driver.run_compare(session, config, "base", "noop", runner=runner)
        assert (runner.prepared, runner.torn_down) == (2, 0)  # one worker, many runs
        for outcome in (first, second):
            invocations = session.scalar(select(func.count()).select_from(Invocation)
                                         .where(Invocation.run_id == outcome.run_id))
            assert invocations == 2 * (1 + 4)  # warm-up pair and 4 pairs, through this runner
    runner.teardown()


def test_build_pair_then_measure_pair_by_hand(write_config, sqlite_url):
    # What a worker that builds and measures in two steps does; run_compare is the same two calls.
    config = small_config(write_config)
    engine = db.make_engine(sqlite_url)
    db.upgrade(sqlite_url)
    builder, runner = CommandBuilder(config), CpuRunner(config.runner)
    with db.session_scope(engine) as session:
        base, broken, noop = (builder.resolve(ref) for ref in ("base", "broken", "noop"))
        repository = get_repository(session, builder.repository_url)
        device = runner.prepare()

        def new_run(treatment) -> Run:
            run = Run(run_type=RunType.BENCHMARK, status=RunStatus.RUNNING, repository_id=repository.id,
                      control_ref="base", treatment_ref=treatment.sha,
                      control_commit_id=get_commit(session, repository, base).id,
                      treatment_commit_id=get_commit(session, repository, treatment).id,
                      device_id=get_device(session, device).id, seed=3, config={})
            session.add(run)
            session.commit()
            return run

        failed = new_run(broken)
        with ExitStack() as held:
            pair = build_pair(session, builder, failed, {Side.CONTROL: ("base", base),
                                                         Side.TREATMENT: ("broken", broken)}, held)
        assert not pair.ok and list(pair.paths) == [Side.CONTROL]
        session.refresh(failed)
        assert failed.status == RunStatus.BUILD_FAILED and "exited with status" in failed.error
        assert session.get(Build, failed.treatment_build_id).status == BuildStatus.BUILD_FAILED

        run = new_run(noop)
        with ExitStack() as held:
            pair = build_pair(session, builder, run, {Side.CONTROL: ("base", base), Side.TREATMENT: ("noop", noop)},
                              held)
            assert pair.ok and all(path.is_dir() for path in pair.paths.values())
            results = driver.measure_pair(session, config, runner, run, device, pair.paths)
        runner.teardown()
        session.refresh(run)
        assert run.status in (RunStatus.COMPLETED, RunStatus.INCOMPLETE) and run.finished_at is not None
        assert [r.workload for r in results] == ["loop"]
        assert session.scalar(select(Comparison.verdict).where(Comparison.run_id == run.id)) == results[0].verdict.verdict
