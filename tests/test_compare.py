"""`abwatch compare` end to end: real git history, real builds, real processes, real databases."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.store.models import (
    Build, BuildStatus, Comparison, Invocation, InvocationStatus, Record, Regression, Run,
    RunStatus, Sample,
)
from tests.conftest import first_device


def run_cli(capsys, *argv) -> tuple[int, dict | None, str]:
    """Run the CLI in-process; return (exit status, parsed JSON stdout or None, stderr)."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    payload = json.loads(captured.out) if captured.out.strip().startswith("{") else None
    return code, payload, captured.err


def compare(capsys, config, db_url, control, treatment):
    return run_cli(capsys, "compare", "--config", config, "--control", control,
                   "--treatment", treatment, "--json", "--db", db_url)


def counts(url: str) -> dict[str, int]:
    engine = db.make_engine(url)
    with engine.connect() as connection:
        return {model.__tablename__: connection.scalar(select(func.count()).select_from(model))
                for model in (Run, Build, Invocation, Sample, Comparison, Regression, Record)}


def test_verdicts_on_a_known_history(capsys, write_config, db_url):
    """No-op -> same, +20 % -> regression near +20 %, -20 % -> improvement; on SQLite and PostgreSQL.

    On a busy machine the noise can leave any of them ``unknown`` (the budget is spent before
    the interval is narrow enough); what must hold whatever the load is that no verdict is
    wrong: a no-op is never a regression or an improvement, a slowdown never an improvement
    or "same", and so on.
    """
    config = write_config()

    code, noop, _ = compare(capsys, config, db_url, "base", "noop")
    assert code == 0
    assert noop["results"][0]["verdict"] in ("same", "unknown"), noop["results"]
    assert noop["results"][0]["regression_id"] is None

    code, slower, err = compare(capsys, config, db_url, "base", "slower")
    result = slower["results"][0]
    assert result["verdict"] in ("regression", "unknown"), result
    assert code == (1 if result["verdict"] == "regression" else 0)
    assert (result["regression_id"] is not None) == (result["verdict"] == "regression")
    if result["verdict"] == "regression":
        # the direction is never wrong, nor the size: under heavy contention (a load of 8 on 2
        # cores stretched wall-time sizes to +98 %) the verdict is judged on CPU time per process
        assert 5.0 < result["change_pct"] < 40.0, result
        assert result["ci_pct"][0] > 0 and result["p_value"] < 0.01
    on_cpu = result["unit"] == "cpu ms"
    assert on_cpu == bool(result["contention"]["heavy"]) and on_cpu == bool(result["caveat"]), result
    assert result["control"]["n"] == result["treatment"]["n"] >= 100  # 100 at the first look
    processes = result["control"]["n"] // 10
    # base was built by the first run: this one takes it from the cache and says so.
    assert [b["cached"] for b in slower["builds"]] == [True, False]
    assert "reused cached build" in err

    code, faster, _ = compare(capsys, config, db_url, "base", "faster")
    assert code == 0
    assert faster["results"][0]["verdict"] in ("improvement", "unknown"), faster["results"]
    if faster["results"][0]["verdict"] == "improvement":
        assert -40.0 < faster["results"][0]["change_pct"] < -5.0

    engine = db.make_engine(db_url)
    with db.session_scope(engine) as session:
        run = session.get(Run, slower["run_id"])
        assert run.status == RunStatus.COMPLETED and run.run_type.value == "benchmark"
        if result["regression_id"] is not None:
            regression = session.get(Regression, result["regression_id"])
            assert regression.state.value == "benchmark"
            assert [e.to_state.value for e in regression.events] == ["benchmark"]
        # every raw sample is stored, warm-up ones flagged, and the order is interleaved
        samples = session.scalars(select(Sample).where(Sample.run_id == run.id)).all()
        reps = processes
        assert len(samples) == 2 * (reps + 1) * 10
        assert sum(s.warmup for s in samples) == 2 * 10
        sides = [i.side.value for i in session.scalars(
            select(Invocation).where(Invocation.run_id == run.id).order_by(Invocation.position))]
        assert sides.count("control") == sides.count("treatment") == reps + 1
        assert sides != sorted(sides)  # not back-to-back blocks
        # one record per side, with the commit as engine_version
        records = session.scalars(select(Record).where(Record.run_id == run.id)).all()
        assert {r.side.value for r in records} == {"control", "treatment"}
        assert {r.engine_version for r in records} == {run.control_commit.sha, run.treatment_commit.sha}
        assert all(len(r.fields["runtime_raw"]) == processes * 10 for r in records)
        # every measured process says how contended it was
        measured = session.scalars(select(Invocation).where(Invocation.run_id == run.id,
                                                            Invocation.warmup.is_(False))).all()
        assert all(i.cpu_s is not None and i.cpu_s > 0 and i.involuntary_switches is not None for i in measured)
        assert all(r.fields["hardware_config"]["cpu_count"] for r in records)
        assert all("pip" in r.fields["software_config"] for r in records)


def test_broken_build_exits_3_and_is_never_a_regression(capsys, write_config, sqlite_url):
    code, payload, err = compare(capsys, write_config(), sqlite_url, "base", "broken")
    assert code == 3
    assert payload["status"] == "build_failed"
    assert payload["results"] == []
    assert [b["status"] for b in payload["builds"]] == ["success", "build_failed"]
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        failed = session.scalars(select(Build).where(Build.status == BuildStatus.BUILD_FAILED)).one()
        assert "this is not C" in failed.log or "error" in failed.log
        assert session.scalar(select(func.count()).select_from(Regression)) == 0
        assert session.scalar(select(func.count()).select_from(Comparison)) == 0
        assert session.get(Run, payload["run_id"]).status == RunStatus.BUILD_FAILED


def test_hung_workload_is_killed_and_recorded_not_a_regression(capsys, write_config, sqlite_url):
    config = write_config(timeout_s=1.5, repetitions=2)
    code, payload, _ = compare(capsys, config, sqlite_url, "base", "hang")
    assert code == 4  # incomplete: a workload could not be judged, which is neither "fine" nor "slower"
    assert payload["status"] == "incomplete"
    result = payload["results"][0]
    assert result["verdict"] == "unknown"
    assert "timeout" in result["failure"]
    assert result["regression_id"] is None
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        statuses = session.scalars(select(Invocation.status).where(Invocation.run_id == payload["run_id"])).all()
        assert InvocationStatus.TIMEOUT in statuses
        assert session.scalar(select(func.count()).select_from(Regression)) == 0


def test_verify_confirms_a_reproduced_regression(capsys, write_config, db_url, monkeypatch):
    monkeypatch.setenv("FLAKY_SLOWDOWN", "1.3")
    config = write_config()
    code, first, _ = compare(capsys, config, db_url, "base", "flaky")
    assert code == 1 and first["results"][0]["verdict"] == "regression"

    code, verified, _ = run_cli(capsys, "verify", first["run_id"], "--json", "--db", db_url)
    assert code == 1
    assert verified["run_type"] == "verify"
    assert verified["results"][0]["control"]["n"] >= 200  # twice the repetitions at the first look
    [regression] = verified["regressions"]
    assert regression["state"] == "regress"
    assert [e["to"] for e in regression["events"]] == ["benchmark", "verify", "regress"]
    assert regression["events"][-1]["run_id"] == verified["run_id"]
    assert "reproduced" in regression["events"][-1]["reason"]
    # the state keeps the verdicts of both runs
    assert regression["benchmark_verdict"]["run_id"] == first["run_id"]
    assert regression["benchmark_verdict"]["verdict"] == "regression"
    assert regression["verify_verdict"]["run_id"] == verified["run_id"]
    assert regression["verify_verdict"]["verdict"] == "regression"
    assert regression["verify_verdict"]["n"][0] >= 200


def test_verify_clears_a_regression_that_does_not_reproduce(capsys, write_config, sqlite_url, monkeypatch):
    monkeypatch.setenv("FLAKY_SLOWDOWN", "1.3")
    config = write_config()
    code, first, _ = compare(capsys, config, sqlite_url, "base", "flaky")
    assert code == 1
    monkeypatch.delenv("FLAKY_SLOWDOWN")  # the slowdown was transient
    code, verified, _ = run_cli(capsys, "verify", first["run_id"], "--json", "--db", sqlite_url)
    assert code == 0
    [regression] = verified["regressions"]
    assert regression["state"] == "cleared"
    assert [e["to"] for e in regression["events"]] == ["benchmark", "verify", "cleared"]
    # a cleared regression cannot be verified again
    code, _, err = run_cli(capsys, "verify", first["run_id"], "--db", sqlite_url)
    assert code == 0 and "nothing to verify" in err and "no regression still waiting for it (its regressions: 1 cleared;" in err  # not a usage error

    code, _, _ = run_cli(capsys, "regressions", "--db", sqlite_url)
    assert code == 0


def test_bad_config_and_unknown_refs_change_nothing(capsys, write_config, fresh_pg_url, tmp_path):
    config = write_config()
    code, _, _ = compare(capsys, config, fresh_pg_url, "base", "noop")
    assert code in (0, 1)
    before = counts(fresh_pg_url)

    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace('command = ["sh", "build.sh"]', ""))
    code, _, err = compare(capsys, bad, fresh_pg_url, "base", "noop")
    assert code == 2
    assert "bad.toml: build.command: field required" in err

    code, _, err = compare(capsys, config, fresh_pg_url, "base", "no-such-tag")
    assert code == 2
    assert "unknown ref 'no-such-tag'" in err

    code, _, err = run_cli(capsys, "compare", "--config", config, "--control=--oops",
                           "--treatment", "base", "--db", fresh_pg_url)
    assert code == 2 and "invalid ref" in err

    assert counts(fresh_pg_url) == before


def test_missing_config_file_is_a_usage_error(capsys, sqlite_url, tmp_path):
    code, _, err = compare(capsys, tmp_path / "nope.toml", sqlite_url, "a", "b")
    assert code == 2 and "nope.toml: cannot read config" in err


@pytest.mark.parametrize("state", ["benchmark", "regress"])
def test_regressions_listing_filters_by_state(capsys, write_config, sqlite_url, state):
    code, first, _ = compare(capsys, write_config(), sqlite_url, "base", "slower")
    assert code == 1
    assert main(["regressions", "--state", state, "--json", "--db", sqlite_url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in listed] == ([state] if state == "benchmark" else [])


def test_adaptive_batches_until_the_budget_is_spent(capsys, write_config, sqlite_url):
    """A workload too noisy to judge gets batches added, up to the budget, and says why it stopped."""
    # noisy in what it reports and in the CPU it spends: under heavy contention a look judges each
    # process's CPU time instead (service/compare/contended.py), which must be as noisy
    noisy = ('python3 -c "import json, random, time\nfor _ in range(3):\n ms = random.uniform(1, 100); '
             'end = time.process_time() + ms / 1000\n while time.process_time() < end: pass\n '
             'print(json.dumps({\'runtime_ms\': ms}))"')
    config = write_config(repetitions=4, run_extra="max_repetitions = 8\nbatch = 2")
    config.write_text(config.read_text().replace('command = ["./bench", "10"]',
                                                 f"command = {json.dumps(['sh', '-c', noisy])}"))
    code, payload, err = compare(capsys, config, sqlite_url, "base", "noop")
    assert code == 0
    result = payload["results"][0]
    assert result["verdict"] == "unknown"
    assert result["stop_reason"].startswith("invocation cap reached (8 a side) at look 3, 8 pairs, ")
    assert result["looks"] == 3 and result["elapsed_s"] > 0
    assert result["control"]["n"] == result["treatment"]["n"] == 8 * 3
    assert err.count("adding 2 pairs") == 2  # looks 1 and 2 added batches; look 3 stopped
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        positions = session.scalars(select(Invocation.position).where(Invocation.run_id == payload["run_id"])
                                    .order_by(Invocation.position)).all()
        assert positions == list(range(2 * (1 + 8)))  # warm-up pair plus 8 pairs, numbered on


def test_easy_verdicts_stop_at_the_first_look(capsys, write_config, sqlite_url):
    code, payload, _ = compare(capsys, write_config(), sqlite_url, "base", "slower")
    assert code == 1
    result = payload["results"][0]
    assert result["stop_reason"].startswith("decided at look ")  # look 1 on a quiet machine
    assert result["correction"] == "benjamini-hochberg" and result["p_adjusted"] is not None


def test_noise_history_sets_the_starting_repetitions(capsys, write_config, sqlite_url):
    from abwatch.service import stats
    from abwatch.service.store.models import NoiseProfile, Workload

    config = write_config(noise_aware=True, run_extra="max_repetitions = 40")
    code, first, err = compare(capsys, config, sqlite_url, "base", "noop")
    assert code == 0 and first["results"][0]["verdict"] in ("same", "unknown")
    assert "no noise history" in err
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        profile = session.scalars(select(NoiseProfile)).one_or_none()
        # learnt from a `same` verdict only (a machine too busy to decide teaches nothing)
        assert (profile is not None) == (first["results"][0]["verdict"] == "same")
        if profile is None:
            workload = session.scalars(select(Workload)).one()
            profile = NoiseProfile(workload_id=workload.id, device_id=first_device(session), observations=1)
            session.add(profile)
        profile.process_cv = 0.03  # a known history: the plan below follows from it
    planned = stats.planned_repetitions(0.03, 2.0, 1 - 0.99, 0.95)
    expected = min(40, max(planned, 4))

    code, second, err = compare(capsys, config, sqlite_url, "base", "noop")
    assert f"{expected} invocations a side (process noise 3.00%" in err
    assert second["results"][0]["control"]["n"] >= expected * 10


def test_aa_keeps_sampling_past_the_old_fixed_budget_and_is_never_called(capsys, write_config, sqlite_url):
    """A plain A/A run with only a time budget: it ends `same` or, if the machine is too
    busy, `unknown` with the time spent; never a regression or improvement. Undecided, it
    takes more pairs than the old fixed budget (3x the first look) instead of stopping."""
    config = write_config(repetitions=4, threshold_pct=1.0, run_extra="max_seconds = 20\nbatch = 4")
    code, payload, err = compare(capsys, config, sqlite_url, "base", "noop")
    result = payload["results"][0]
    assert code == 0 and result["verdict"] in ("same", "unknown")
    assert result["control"]["n"] == result["treatment"]["n"]
    pairs = result["control"]["n"] // 10
    if result["verdict"] == "same":
        assert result["stop_reason"].startswith(f"decided at look {result['looks']}, {pairs} pairs")
    else:
        assert result["stop_reason"].startswith("time budget spent (20s)") and pairs > 3 * 4
    assert pairs >= 8  # nothing is decided on fewer pairs


def test_history_command_lists_the_measured_commits(capsys, write_config, sqlite_url):
    config = write_config(repetitions=4)
    for treatment in ("noop", "slower"):
        compare(capsys, config, sqlite_url, "base", treatment)
    assert main(["history", "loop", "--json", "--db", sqlite_url]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["series"]) == 3  # base, noop, slower, in commit order
    # each point's median comes from its own run: no comparison across runs, which a busy
    # machine can turn around (the step itself is judged within one run, by compare)
    assert all(point["median_ms"] > 0 for point in payload["series"])
    assert main(["history", "nothing", "--db", sqlite_url]) == 2
    assert "no history for workload 'nothing'; measured workloads: loop" in capsys.readouterr().err
    assert main(["history", "lop", "--db", sqlite_url]) == 2
    assert "no history for workload 'lop'; did you mean 'loop'? measured workloads: loop" in capsys.readouterr().err


def test_a_run_stopped_by_an_unexpected_error_is_marked_failed(write_config, sqlite_url, monkeypatch):
    """Fault injection (the one way to make abwatch itself fail mid-run): the run must not stay 'running'."""
    from abwatch.service.compare import driver
    from abwatch.service.config import load_config

    def explode(verdicts):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(driver.stats, "adjust_fdr", explode)
    engine = db.make_engine(sqlite_url)
    db.ensure_schema(engine)
    with db.session_scope(engine) as session, pytest.raises(RuntimeError, match="injected fault"):
        driver.run_compare(session, load_config(write_config(repetitions=2)), "base", "noop")
    with db.session_scope(engine) as session:
        run = session.scalars(select(Run)).one()
        assert run.status == RunStatus.FAILED and "injected fault" in run.error and run.finished_at
        assert session.scalar(select(func.count()).select_from(Sample)) > 0  # what was measured is kept
