"""A pinned base (``control = "fixed:<ref>"``): every later commit is compared with the same base,
so a regression introduced at C shows again at C+1, C+2 and every night after. Those are one
regression (its culprit C), seen again, noted on it: not new regressions, verifications,
bisections and alerts each time. A real git history, real builds and benchmark processes,
real PostgreSQL.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Comparison, Run, RunType, WatchedCommit

from tests.test_watch import regressions_json, shas, step, write_watch_config


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def test_a_regression_against_a_pinned_base_is_one_regression_seen_again(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("v1.0", "Release"),))
    # the steps are 25 %: a 5 % threshold, so that two builds of the same code measured on a busy
    # host (a1 against a2, slow2 against a4) are not told apart by a percent of load (beside six
    # busy loops a 1 % threshold once opened a regression at the README commit a4)
    config = write_watch_config(tmp_path, repo, 'control = "fixed:v1.0"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # the base: built
    make_demo_repo(repo, (step("n1", "README", note="n1"), step("slow", "Do 25% more work", 1.25),
                          step("a1", "README", 1.25, note="a1"), step("a2", "README", 1.25, note="a2")))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1  # slow: confirmed
    tags = shas(repo)
    found = regressions_json(fresh_pg_url, capsys)
    assert len(found) == 1, [(r["id"], r["treatment_sha"][:12], r["state"]) for r in found]
    r = found[0]
    assert r["state"] == "regress" and r["culprit"]["sha"] == tags["slow"]
    assert r["range"] == {"good": tags["v1.0"], "bad": tags["slow"]}
    seen = [e for e in r["events"] if e["from"] == e["to"] == "regress"]
    assert [e["reason"].split("(")[1][:12] for e in seen] == [tags["a1"][:12], tags["a2"][:12]]
    assert all("the same regression, not opened again" in e["reason"] for e in seen)

    # the next night: still slower than the base, the same regression; nothing new is confirmed
    make_demo_repo(repo, (step("a3", "README", 1.25, note="a3"),))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    tags = shas(repo)
    found = regressions_json(fresh_pg_url, capsys)
    assert len(found) == 1 and len([e for e in found[0]["events"] if e["from"] == e["to"]]) == 3

    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        # each later commit was compared with the base and found slower: its run is the note's
        slower = session.scalars(select(Comparison.run_id).where(Comparison.verdict == "regression")).all()
        assert {e["run_id"] for e in found[0]["events"] if e["from"] == e["to"]} <= set(slower)
        # verified once, by one verify run; no second verification, so no second alert
        assert session.scalar(select(func.count()).select_from(Run).where(Run.run_type == RunType.VERIFY)) == 1
        controls = {w.commit.sha: w.control_sha for w in session.scalars(select(WatchedCommit))}
    assert {controls[tags[t]] for t in ("n1", "slow", "a1", "a2", "a3")} == {tags["v1.0"]}

    # a further slowdown is a regression of its own, bisected from where the first one was last
    # seen (from the base, every commit since `slow` is slower and `slow` would be named again)
    make_demo_repo(repo, (step("slow2", "Do 25% more work again", 1.25 * 1.25),
                          step("a4", "README", 1.25 * 1.25, note="a4")))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    tags = shas(repo)
    found = regressions_json(fresh_pg_url, capsys)
    assert [(r["state"], r["culprit"]["sha"]) for r in found] == [("regress", tags["slow"]), ("regress", tags["slow2"])]
    assert found[1]["range"] == {"good": tags["v1.0"], "bad": tags["slow2"]}
    assert found[0]["group"] != found[1]["group"]
    assert {s["sha"] for s in found[1]["bisection"]} <= {tags["slow2"]}  # nothing before a3 tried again
    assert [e["reason"].split("(")[1][:12] for e in found[1]["events"] if e["from"] == e["to"]] == [tags["a4"][:12]]

    # back to the base's work: both are fixed
    make_demo_repo(repo, (step("back", "Back to the release's work", 1.0),))
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0
    found = regressions_json(fresh_pg_url, capsys)
    assert [r["state"] for r in found] == ["fixed", "fixed"]
    assert all("back to the base" in r["events"][-1]["reason"] for r in found)
    engine.dispose()
