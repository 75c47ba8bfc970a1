"""The driver's parts apart: a build without a run, a caller's builder and runner, build then measure.

Real git history, real builds and real workload processes on SQLite (the small C benchmark
of ``conftest.HISTORY``); budgets are small, and no verdict is asserted (timing noise).
"""

from __future__ import annotations

import shutil
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


def test_a_build_made_in_another_cache_directory_has_its_own_row(write_config, sqlite_url, tmp_path):
    """Two configs with two cache directories, one database: each place's build row says what
    happened there (built, its own time), never the other's; a cache that holds an artifact it
    did not build names the build it reused."""
    from abwatch.service.cli.report import print_outcome
    from abwatch.service.read import queries
    from abwatch.service.read.stored import load_outcome
    from rich.console import Console

    first_path = write_config(repetitions=4, run_extra="max_repetitions = 4")
    text = first_path.read_text()
    configs = {}
    for name in ("a", "b"):
        path = tmp_path / f"{name}.toml"
        path.write_text(text.replace(str(tmp_path / "cache"), str(tmp_path / f"cache-{name}")))
        configs[name] = load_config(path)
    engine = db.make_engine(sqlite_url)
    db.upgrade(sqlite_url)
    with db.session_scope(engine) as session:
        first = driver.run_compare(session, configs["a"], "base", "slower")
        second = driver.run_compare(session, configs["b"], "base", "slower")
        assert not any(b.cached or b.reused for b in second.builds)  # built again there: said so
        rows = {run: [session.get(Build, b.build_id) for b in outcome.builds]
                for run, outcome in (("a", first), ("b", second))}
        for row_a, row_b in zip(rows["a"], rows["b"], strict=True):
            assert row_a.id != row_b.id and row_a.artifact_key == row_b.artifact_key
            assert not row_b.cached and row_b.duration_s and row_b.duration_s > 0
            assert row_a.place.endswith(f":{tmp_path / 'cache-a' / 'artifacts'}")
            assert row_b.place.endswith(f":{tmp_path / 'cache-b' / 'artifacts'}")
        shown = load_outcome(session, second.run_id)
        assert [(b.cached, b.reused) for b in shown.outcome.builds] == [(False, ""), (False, "")]
        report = queries.run_report(session, second.run_id)
        assert [b["duration_s"] for b in report["builds"]] == [r.duration_s for r in rows["b"]]
        console = Console(record=True, width=200)
        print_outcome(console, shown, as_json=False)
        assert "(cached)" not in console.export_text()

        again = driver.run_compare(session, configs["b"], "base", "slower")  # this place's cache serves it
        assert [(b.cached, b.build_id) for b in again.builds] == [(True, r.id) for r in rows["b"]]

        # a third place whose cache holds the artifacts it did not build (as one fetched from the store)
        shutil.copytree(tmp_path / "cache-a", tmp_path / "cache-c", symlinks=True)
        path = tmp_path / "c.toml"
        path.write_text(text.replace(str(tmp_path / "cache"), str(tmp_path / "cache-c")))
        third = driver.run_compare(session, load_config(path), "base", "slower")
        for b, row_a in zip(third.builds, rows["a"], strict=True):
            assert b.cached and b.build_id == row_a.id  # no row claims it was built there: the reuse is named
            assert b.reused == f"reused build #{row_a.id} built on {row_a.place.partition(':')[0]} in " \
                               f"{tmp_path / 'cache-a' / 'artifacts'}"
        assert session.scalar(select(func.count()).select_from(Build)) == 4
        console = Console(record=True, width=300)
        print_outcome(console, load_outcome(session, third.run_id), as_json=False)
        assert f"(reused build #{rows['a'][0].id} built on " in console.export_text()
