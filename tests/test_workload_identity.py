"""One identity per workload: (repository, name, spec hash). Two repositories or two specs with a
workload called ``loop`` are two series; history, noise profiles and the views never mix them."""

from __future__ import annotations

import pytest
import json
from datetime import datetime, UTC

import git
from sqlalchemy import select, text

from abwatch.service.store import db
from abwatch.service.store.models import Comparison, Invocation, NoiseProfile, Regression, Sample, Workload
from abwatch.service.store.rows import workload_spec_hash
from tests.test_compare import compare, run_cli
from tests.test_concurrency import _config


def test_two_repositories_and_a_changed_spec_are_three_series(capsys, bench_repo, db_url, tmp_path):
    other = tmp_path / "fork"
    git.Repo.clone_from(str(bench_repo), other)  # the same history at another URL: another repository
    cache = tmp_path / "cache"
    first = _config(tmp_path / "a.toml", bench_repo, cache, repetitions=4)
    fork = _config(tmp_path / "b.toml", other, cache, repetitions=4)
    changed = _config(tmp_path / "c.toml", bench_repo, cache, repetitions=4, command='["./bench", "12"]')

    code, a, err = compare(capsys, first, db_url, "base", "noop")
    assert code in (0, 1) and "spec changed" not in err
    code, b, err = compare(capsys, fork, db_url, "base", "slower")
    assert code in (0, 1) and "spec changed" not in err  # another repository: not a change of this one
    code, c, err = compare(capsys, changed, db_url, "base", "noop")
    assert code in (0, 1)
    assert "loop: its spec changed" in err and "a new series starts" in err
    code, _, err = compare(capsys, changed, db_url, "noop", "slower")
    assert "spec changed" not in err  # said once, when the series starts

    engine = db.make_engine(db_url)
    with db.session_scope(engine) as session:
        rows = list(session.scalars(select(Workload).order_by(Workload.id)))
        assert [w.name for w in rows] == ["loop"] * 3
        assert len({(w.repository_id, w.spec_hash) for w in rows}) == 3
        assert rows[0].repository_id == rows[2].repository_id != rows[1].repository_id
        assert rows[0].spec["command"] == ["./bench", "10"] and rows[2].spec["command"] == ["./bench", "12"]
        by_run = dict(session.execute(select(Comparison.run_id, Comparison.workload_id)).all())
        assert by_run[a["run_id"]] == rows[0].id and by_run[b["run_id"]] == rows[1].id
        assert by_run[c["run_id"]] == rows[2].id
        # every view row's series is one repository and one spec
        for view in ("workload_series", "latest_status"):
            seen = session.execute(text(f"SELECT workload_id, repository, spec_hash FROM {view}")).all()
            assert {r.workload_id for r in seen} == {w.id for w in rows}, view
            for workload_id, repository, spec_hash in seen:
                row = session.get(Workload, workload_id)
                assert (repository, spec_hash) == (row.repository.url, row.spec_hash), view
        series_urls = session.execute(text(
            "SELECT workload_id, COUNT(DISTINCT repository) FROM workload_series GROUP BY workload_id")).all()
        assert all(count == 1 for _, count in series_urls)
    engine.dispose()

    # history: the newest series by default, and says which others there are
    code, payload, err = run_cli(capsys, "history", "loop", "--json", "--all-branches", "--db", db_url)
    assert code == 0
    assert payload["series_id"] == rows[2].id and payload["spec_hash"] == rows[2].spec_hash
    assert sorted(p["sha"][:7] for p in payload["series"]) == sorted(
        git.Repo(bench_repo).commit(t).hexsha[:7] for t in ("base", "noop", "slower"))
    assert "3 series" in err and f"{rows[1].id}: {other}" in err
    code, payload, _ = run_cli(capsys, "history", "loop", "--json", "--all-branches", "--series", rows[1].id,
                               "--db", db_url)
    assert code == 0 and payload["repository"] == str(other)
    assert len(payload["series"]) == 2  # the fork's base and slower only
    code, _, err = run_cli(capsys, "history", "loop", "--series", 999, "--db", db_url)
    assert code == 2 and "has no series 999" in err


def _insert(connection, table: str, **values) -> int:
    columns = ", ".join(values)
    marks = ", ".join(f":{k}" for k in values)
    return connection.execute(text(f"INSERT INTO {table} ({columns}) VALUES ({marks}) RETURNING id"),
                              {k: json.dumps(v) if isinstance(v, (dict, list)) else v
                               for k, v in values.items()}).scalar_one()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_migration_splits_a_shared_workload_row_and_keeps_every_row(empty_db_url):
    db_url = empty_db_url
    """A database from before identities: one ``mlp`` row measured in two repositories and with two
    specs. Upgrading gives each its own row and moves what each run measured; nothing is lost."""
    db.upgrade(db_url, "0009")
    engine = db.make_engine(db_url)
    now = datetime(2026, 11, 1, tzinfo=UTC)
    spec1 = {"name": "mlp", "kind": "command", "command": ["./mlp"], "env": {}, "timeout_s": None}
    spec2 = {**spec1, "command": ["./mlp", "--big"]}
    with engine.begin() as c:
        r1, r2 = _insert(c, "repositories", url="/one", created_at=now), _insert(c, "repositories", url="/two", created_at=now)
        commits = [_insert(c, "commits", repository_id=r, sha=f"{i:040x}", summary="", author="")
                   for i, r in enumerate((r1, r1, r2, r2))]
        device = _insert(c, "devices", name="board", kind="cpu", hardware_config={})
        workload = _insert(c, "workloads", name="mlp", kind="command", spec=spec2)
        runs = []
        for repository, (good, bad), spec in ((r1, commits[:2], spec1), (r2, commits[2:], spec1), (r1, commits[:2], spec2)):
            run = _insert(c, "runs", run_type="benchmark", status="completed", repository_id=repository,
                          control_ref="a", treatment_ref="b", control_commit_id=good, treatment_commit_id=bad,
                          device_id=device, seed=1, config={"workloads": [spec]}, started_at=now)
            invocation = _insert(c, "invocations", run_id=run, workload_id=workload, side="control", position=0,
                                 warmup=False, status="ok", wall_s=0.1, message="")
            _insert(c, "samples", invocation_id=invocation, run_id=run, workload_id=workload, side="control",
                    order_index=0, runtime_ms=1.0, warmup=False)
            comparison = _insert(c, "comparisons", run_id=run, workload_id=workload, verdict="regression",
                                 change_pct=9.0, control_n=1, treatment_n=1, details={})
            runs.append((run, comparison))
        # the first run's regression, and a duplicate of it opened by re-running the pair
        for _ in range(2):
            _insert(c, "regressions", workload_id=workload, device_id=device, control_commit_id=commits[0],
                    treatment_commit_id=commits[1], run_id=runs[0][0], comparison_id=runs[0][1], state="benchmark",
                    kind="speed", change_pct=9.0, created_at=now, updated_at=now)
        _insert(c, "noise_profiles", workload_id=workload, device_id=device, process_cv=0.01, observations=3,
                updated_at=now)
        _insert(c, "workloads", name="never-measured", kind="command", spec={})
    db.upgrade(db_url)

    with db.session_scope(engine) as session:
        rows = {(w.repository.url, w.spec_hash): w for w in session.scalars(select(Workload))}
        h1, h2 = workload_spec_hash("command", spec1), workload_spec_hash("command", spec2)
        assert set(rows) == {("/one", h1), ("/two", h1), ("/one", h2)}
        assert rows[("/one", h2)].id == workload  # the newest run's identity keeps the row and its profile
        assert session.scalars(select(NoiseProfile.workload_id)).all() == [workload]
        assert session.scalars(select(NoiseProfile.lessons)).all() == [3]  # 0040: each `same` run was a lesson
        for (run, _), key in zip(runs, [("/one", h1), ("/two", h1), ("/one", h2)], strict=False):
            for model in (Comparison, Invocation, Sample):
                assert session.scalars(select(model.workload_id).where(model.run_id == run)).all() == [rows[key].id]
        regressions = list(session.scalars(select(Regression).order_by(Regression.id)))
        assert {r.workload_id for r in regressions} == {rows[("/one", h1)].id}
        assert [r.state.value for r in regressions] == ["benchmark", "cleared"]
        assert "duplicate of regression" in regressions[1].events[-1].reason
    db.downgrade(db_url, "0009")
    with engine.connect() as c:
        assert c.execute(text("SELECT name FROM workloads")).scalars().all() == ["mlp"]
        assert c.execute(text("SELECT COUNT(DISTINCT workload_id) FROM samples")).scalar() == 1
    engine.dispose()


def test_noise_profiles_belong_to_one_series(session):
    """Two repositories' ``mlp`` and a changed spec learn and read their own noise."""
    from abwatch.service.compare import noise
    from abwatch.service.store.models import Device
    from abwatch.service.store.rows import get_repository, get_workload

    one, two = get_repository(session, "/noise-one"), get_repository(session, "/noise-two")
    series = [get_workload(session, one.id, "mlp", "command", {"command": ["./mlp"]}),
              get_workload(session, two.id, "mlp", "command", {"command": ["./mlp"]}),
              get_workload(session, one.id, "mlp", "command", {"command": ["./mlp", "--big"]})]
    assert len({w.id for w in series}) == 3
    # the same spec with another timeout is the same series
    assert get_workload(session, one.id, "mlp", "command", {"command": ["./mlp"], "timeout_s": 9}).id == series[0].id
    device = Device(name="noise-board", kind="cpu", hardware_config={})
    session.add(device)
    session.flush()
    quiet = {"control": [1.0, 1.0, 1.01, 1.01, 1.0, 1.0], "treatment": [1.0, 1.01, 1.0, 1.0, 1.01, 1.0]}
    loud = {"control": [1.0, 1.0, 1.4, 1.4, 0.8, 0.8], "treatment": [1.0, 1.0, 0.7, 0.7, 1.3, 1.3]}
    groups = {"control": [0, 0, 1, 1, 2, 2], "treatment": [0, 0, 1, 1, 2, 2]}
    noise.learn(session, series[0].id, device.id, quiet, groups)
    noise.learn(session, series[1].id, device.id, loud, groups)
    profiles = {p.workload_id: p for p in session.scalars(select(NoiseProfile).where(NoiseProfile.device_id == device.id))}
    assert set(profiles) == {series[0].id, series[1].id}  # the changed spec has learnt nothing yet
    assert profiles[series[0].id].process_cv < profiles[series[1].id].process_cv / 5
    assert all(p.observations == 1 for p in profiles.values())
