"""The watch end to end: a real git branch that grows between passes, real builds and processes,
real PostgreSQL. The benchmark times itself with its process's CPU clock, so the busy test
machine's other load does not hide a +3 % change; where a test is about the watch's steps
(which commits are compared, verified, bisected and marked fixed) rather than the timing, the
benchmark is measured by the instructions it retires (Valgrind): one CI machine's CPU clock
spread 7 % between processes, where `same` within 1 % (a regression fixed) cannot be decided.
"""

from __future__ import annotations

import pytest
import json
import math
from pathlib import Path

import git
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import Step, make_demo_repo
from abwatch.service.store.models import BisectionStep, Job, Run, RunStatus, WatchedCommit

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

W = 1_500_000  # ~3 ms a sample


def step(tag: str, message: str, factor: float = 1.0, **kw) -> Step:
    """A commit whose benchmark does ``factor`` times the base work."""
    return Step(tag, message, work=int(W * factor), cpu_clock=True, **kw)


# the benchmark counted, not timed: its verdicts do not hang on the machine's load
COUNTED = 'measure = ["instructions"]'


def write_watch_config(tmp_path, repo, watch: str, threshold_pct: float = 1.0, measure: str = "") -> str:
    """A watch config for ``repo`` with a ``[watch]`` section ``watch`` (``measure``: the
    workloads' ``measure`` line, e.g. :data:`COUNTED`; none: timed)."""
    path = tmp_path / "watch.toml"
    path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "loop"
command = ["./bench", "10"]
{measure}
[run]
repetitions = 10
max_repetitions = 40
timeout_s = 30
noise_aware = false
[stats]
threshold_pct = {threshold_pct}
[runner]
device = "bench-box"
[watch]
{watch}
""")
    return str(path)


def regressions_json(url: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["regressions", "--json", "--db", url]) == 0
    return json.loads(capsys.readouterr().out)


def shas(repo) -> dict[str, str]:
    return {t.name: t.commit.hexsha for t in git.Repo(repo).tags}


def test_every_commit_mode_verifies_names_culprits_skips_broken_and_marks_fixed(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'control = "previous"', measure=COUNTED)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # baseline only
    make_demo_repo(repo, (
        step("noop1", "Reword the README", note="words"),
        step("slow6", "Do 6% more work", 1.06),
        step("broken", "Break the build", 1.06, broken=True),
        step("slow12", "Do 12% more work again", 1.06 * 1.12),
        step("noop2", "Reword the README again", 1.06 * 1.12, note="more words"),
        step("fast", "Back to the original work", 1.0),
    ))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1  # confirmed
    tags = shas(repo)
    found = regressions_json(fresh_pg_url, capsys)
    assert sorted(r["culprit"]["sha"] for r in found) == sorted([tags["slow6"], tags["slow12"]])
    for r in found:
        assert r["state"] == "fixed" and r["workload"] == "loop" and r["device"] == "bench-box"
        assert r["culprit"]["summary"] in ("Do 6% more work", "Do 12% more work again")
        assert r["culprit"]["author"].startswith("abwatch example")
        assert r["range"]["bad"] == r["culprit"]["sha"]
        assert r["group"] == r["id"]  # one culprit each, so each its own group
    # the commit after the broken one was compared with the last good one (slow6)
    by_range = {r["range"]["bad"]: r for r in found}
    assert by_range[tags["slow12"]]["range"]["good"] == tags["slow6"]
    assert 10 <= by_range[tags["slow12"]]["change_pct"] <= 14
    assert 4 <= by_range[tags["slow6"]]["change_pct"] <= 8
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        statuses = {w.commit.sha: w.status for w in session.scalars(select(WatchedCommit))}
        assert statuses[tags["broken"]] == "build_failed"
        assert statuses[tags["base"]] == "baseline"
        assert {statuses[tags[t]] for t in ("noop1", "slow6", "slow12", "noop2", "fast")} == {"ok"}
        assert session.scalar(select(func.count()).select_from(Run).where(Run.status == RunStatus.RUNNING)) == 0
        assert session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")) == 0
    capsys.readouterr()
    assert main(["status", "--json", "--db", fresh_pg_url]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["watched"][0]["last_tested"] == tags["fast"] and status["queue"]["bench-box"] == {"done": 7}
    # nothing new: a pass does nothing and confirms nothing
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    engine.dispose()


def test_nightly_mode_bisects_to_each_culprit_within_the_build_bound(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', measure=COUNTED)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    day1 = (step("a1", "Tidy the README", note="a1"), step("a2", "More README", note="a2"),
            step("slow3", "Do 3% more work", 1.03), step("a3", "README", 1.03, note="a3"),
            step("broken1", "Break the build", 1.03, broken=True), step("a4", "Fix the build", 1.03, note="a4"),
            step("a5", "README once more", 1.03, note="a5"))
    make_demo_repo(repo, day1)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    day2 = (step("b1", "README", 1.03, note="b1"), step("slow12", "Do 12% more work", 1.03 * 1.12),
            step("b2", "README", 1.03 * 1.12, note="b2"), step("b3", "README", 1.03 * 1.12, note="b3"))
    make_demo_repo(repo, day2)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    tags = shas(repo)
    found = regressions_json(fresh_pg_url, capsys)
    assert [r["culprit"]["sha"] for r in found] == [tags["slow3"], tags["slow12"]]
    assert [r["state"] for r in found] == ["regress", "regress"]
    assert found[0]["range"] == {"good": tags["base"], "bad": tags["a5"]}
    assert found[1]["range"] == {"good": tags["a5"], "bad": tags["b3"]}
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        for r, n, broken in ((found[0], len(day1), 1), (found[1], len(day2), 0)):
            steps = list(session.scalars(select(BisectionStep).where(BisectionStep.regression_id == r["id"])))
            built = {s.commit_id for s in steps}
            assert len(built) <= math.ceil(math.log2(n)) + 1 + broken, r["bisection"]
            assert len(r["bisection"]) == len(steps) > 0
    # every step names its commit and verdict; the culprit's own step says bad
    culprit_steps = [s for s in found[0]["bisection"] if s["sha"] == tags["slow3"]]
    assert culprit_steps and culprit_steps[0]["side"] == "bad"
    engine.dispose()


def test_watch_config_errors_name_the_key(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    for bad, key in (('control = "newest"', "watch.control"), ('schedule = "every night"', "watch.schedule"),
                     ('timezone = "Mars/Olympus"', "watch.timezone"), ("step = 0", "watch.step"),
                     ("interval = 5", "watch.interval")):
        config = write_watch_config(tmp_path, repo, bad)
        capsys.readouterr()
        assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 2
        assert f"watch.toml: {key}" in capsys.readouterr().err


def test_workloads_with_different_culprits_in_one_range_each_get_their_own(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"')
    # a second workload: the same program, told by $SLOW_B to do 25 % more work once a commit reads it
    text = Path(config).read_text().replace('[run]', '[[workloads]]\nname = "b"\ncommand = ["./bench", "10"]\n'
                                            'env = {SLOW_B = "1.25"}\n[run]')
    Path(config).write_text(text)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    day = (step("n1", "README", note="n1"),
           step("x", "Read SLOW_B: b does 25% more work", env_factor="SLOW_B"),
           step("n2", "README", env_factor="SLOW_B", note="n2"),
           step("y", "Do 25% more work everywhere", 1.25, env_factor="SLOW_B"),
           step("n3", "README", 1.25, env_factor="SLOW_B", note="n3"))
    make_demo_repo(repo, day)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    tags = shas(repo)
    found = {r["workload"]: r for r in regressions_json(fresh_pg_url, capsys)}
    # loop regressed at y only; b first at x: a joint bisection would have blamed x for both
    assert found["loop"]["culprit"]["sha"] == tags["y"]
    assert found["b"]["culprit"]["sha"] == tags["x"]
    assert found["loop"]["group"] != found["b"]["group"]
    tried = {s["sha"] for r in found.values() for s in r["bisection"]}
    assert len(tried) <= 2 * (math.ceil(math.log2(len(day))) + 1)  # each culprit within its bound
    assert all(r["range"] == {"good": tags["base"], "bad": tags["n3"]} for r in found.values())


def test_on_sqlite_a_hung_benchmark_is_recorded_and_the_watch_goes_on(tmp_path, sqlite_url, capsys):
    # SQLite: `watch --once` runs the very jobs a worker would, in this process
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, "")
    text = Path(config).read_text().replace("timeout_s = 30", "timeout_s = 3")  # the hang ends in 3 s
    Path(config).write_text(text)
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, (step("hang", "Wait forever", hang=True),
                          step("slow25", "Stop waiting, do 25% more work", 1.25)))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1
    tags = shas(repo)
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        rows = {w.commit.sha: w for w in session.scalars(select(WatchedCommit))}
        assert rows[tags["hang"]].status == "failed"  # recorded as hung, never a regression
        assert rows[tags["slow25"]].control_sha == tags["base"]  # compared with the last good one
        assert session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")) == 0
    found = regressions_json(sqlite_url, capsys)
    assert [(r["culprit"]["sha"], r["state"]) for r in found] == [(tags["slow25"], "regress")]
    engine.dispose()

