"""Bisecting any confirmed change (``[watch] bisect = ["regression", "improvement"]``): an
improvement is verified and bisected like a regression, its cause stored and alerted as the
commit that made it faster, and never counted or listed as a regression; and a regression the
watch finds fixed names the commit that fixed it. A real git history, real builds and benchmark
processes, measured by the instructions they retire (Valgrind), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.notify import alerts
from abwatch.service.store import db
from abwatch.service.store.models import AlertDelivery, BisectionStep, Regression

from tests.test_watch import COUNTED, regressions_json, shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds, runs and processes

# a range of four commits (every fourth is tested), the third of them 10 % faster
FASTER = (step("n1", "README", note="n1"), step("n2", "README", note="n2"),
          step("fast", "Do 10% less work", 0.9), step("n3", "README", 0.9, note="n3"))


def _listed(url: str, capsys, *flags: str) -> str:
    capsys.readouterr()
    assert main(["regressions", *flags, "--db", url]) == 0
    return capsys.readouterr().out


def test_an_improvement_is_bisected_to_its_commit_and_is_no_regression(tmp_path, db_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'step = 4\nbisect = ["regression", "improvement"]', measure=COUNTED)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0  # the baseline
    make_demo_repo(repo, FASTER)
    assert main(["watch", "--config", config, "--once", "--db", db_url]) == 0  # an improvement fails nothing
    tags = shas(repo)
    assert regressions_json(db_url, capsys) == []  # not a regression
    assert "improvement" not in _listed(db_url, capsys)
    [found] = json.loads(_listed(db_url, capsys, "--improvements", "--json"))
    assert found["direction"] == "faster" and found["state"] == "regress" and -12 <= found["change_pct"] <= -8
    assert found["range"] == {"good": tags["base"], "bad": tags["n3"]}
    assert found["culprit"]["sha"] == tags["fast"] and found["culprit_line"].startswith("cause: ")
    # bisected: n2 (the middle) as good as the base, `fast` as fast as n3
    assert [(s["sha"], s["side"]) for s in found["bisection"]] == [(tags["n2"], "good"), (tags["fast"], "bad")]
    assert "caused by" in _listed(db_url, capsys, "--improvements")
    engine = db.make_engine(db_url)
    with Session(engine) as session:
        improvement = session.get_one(Regression, found["id"])
        text = alerts.payload(improvement, "culprit")["text"]
        assert f"faster (runtime) since {tags['fast'][:12]}" in text and "the commit that made it faster" in text
        assert "slower" not in text
    capsys.readouterr()
    assert main(["status", "--json", "--db", db_url]) == 0
    assert json.loads(capsys.readouterr().out)["open_regressions"] == 0
    engine.dispose()


def test_by_default_an_improvement_is_not_kept_nor_bisected(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, "step = 4", measure=COUNTED)
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, FASTER)
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        for table in (Regression, BisectionStep, AlertDelivery):
            assert session.scalar(select(func.count()).select_from(table)) == 0
    engine.dispose()
    assert json.loads(_listed(sqlite_url, capsys, "--improvements", "--json")) == []


def test_a_fixed_regression_names_the_commit_that_fixed_it(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    # improvements bisected too: the one that fixed the regression is that fix, not an improvement of its own
    config = write_watch_config(tmp_path, repo, 'step = 3\nbisect = ["regression", "improvement"]', measure=COUNTED)
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0
    make_demo_repo(repo, (step("slow", "Do 10% more work", 1.1), step("s1", "README", 1.1, note="s1"),
                          step("s2", "README", 1.1, note="s2")))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 1  # confirmed, bisected
    make_demo_repo(repo, (step("s3", "README", 1.1, note="s3"), step("back", "Back to the old work", 1.0),
                          step("b1", "README", note="b1")))
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0  # fixed at b1, by `back`
    tags = shas(repo)
    [found] = regressions_json(sqlite_url, capsys)
    assert found["state"] == "fixed" and found["culprit"]["sha"] == tags["slow"]
    assert found["fixed_by_commit"]["sha"] == tags["back"]
    assert f"fixed by {tags['back'][:12]} Back to the old work" in _listed(sqlite_url, capsys)
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:  # the `fixed` alert names it too
        text = alerts.payload(session.get_one(Regression, found["id"]), "fixed")["text"]
        assert text.endswith(f"no longer reproduces; fixed by {tags['back'][:12]} \"Back to the old work\"")
    engine.dispose()
    assert json.loads(_listed(sqlite_url, capsys, "--improvements", "--json")) == []
