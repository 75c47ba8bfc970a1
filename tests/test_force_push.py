"""After a force-push: the warning is said once per force-push (also when the branch was only
reset to an older commit), and a confirmed regression whose culprit left the branch is closed
as ``cleared`` with the reason. Real git repositories, real builds, real databases.
"""

from __future__ import annotations

import git
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store import db
from abwatch.service.store.models import Regression, WatchProgress
from tests.test_watch import shas, step, write_watch_config
from tests.test_watch_control import History, config_for, engine, take_up  # noqa: F401 - engine: a fixture

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers


def test_the_warning_is_said_once_when_the_branch_is_reset_back(tmp_path, engine, capsys):  # noqa: F811
    h = History(tmp_path / "repo")
    a = h.commit("a")
    b, c = h.commit("b"), h.commit("c")
    config = config_for(tmp_path, h.path, start=a)
    assert take_up(engine, config) == [(a, None), (b, a), (c, b)]
    h.repo.git.reset("--hard", b)  # pushed with --force: c left the branch, nothing new came
    capsys.readouterr()
    assert take_up(engine, config) == []
    err = capsys.readouterr().err
    assert err.count("force-pushed") == 1 and c[:12] in err and f"fork point {b[:12]}" in err
    with Session(engine) as session:
        assert session.scalars(select(WatchProgress)).one().last_seen_sha == b
    for _ in range(2):  # the same branch again: nothing to say
        assert take_up(engine, config) == []
        assert "force-pushed" not in capsys.readouterr().err
    d = h.commit("d")  # the branch goes on from b
    assert take_up(engine, config) == [(d, b)]
    assert "force-pushed" not in capsys.readouterr().err


def test_a_regression_whose_culprit_left_the_branch_is_cleared_with_the_reason(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "0 2 * * *"\ntimezone = "UTC"', threshold_pct=5.0)
    url = fresh_pg_url
    assert main(["watch", "--config", config, "--once", "--db", url]) == 0  # the baseline
    make_demo_repo(repo, (step("a1", "README", note="a1"), step("slow", "Do 25% more work", 1.25),
                          step("a2", "README", 1.25, note="a2")))
    assert main(["watch", "--config", config, "--once", "--db", url]) == 1
    tags = shas(repo)
    database = db.make_engine(url)
    with Session(database) as session:
        regression = session.scalars(select(Regression)).one()
        assert regression.state.value == "regress" and regression.culprit_commit.sha == tags["slow"]
        regression_id = regression.id

    # the slow commit is taken back out with a force-push, and the branch goes on without it
    git.Repo(repo).git.reset("--hard", tags["a1"])
    make_demo_repo(repo, (step("b1", "README again", note="b1"),))
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", url]) == 0
    err = capsys.readouterr().err
    assert err.count("was force-pushed") == 1
    assert f"its culprit {tags['slow'][:12]} is no longer on branch 'main'" in err
    with Session(database) as session:
        regression = session.get_one(Regression, regression_id)
        assert regression.state.value == "cleared" and regression.culprit_commit.sha == tags["slow"]
        last = regression.events[-1]
        assert (last.from_state.value, last.to_state.value) == ("regress", "cleared")
        assert "no longer on branch 'main'" in last.reason and "force-pushed" in last.reason
        events = len(regression.events)
    # the next pass says nothing more and changes nothing
    assert main(["watch", "--config", config, "--once", "--db", url]) == 0
    err = capsys.readouterr().err
    assert "force-pushed" not in err and "no longer on branch" not in err
    with Session(database) as session:
        assert len(session.get_one(Regression, regression_id).events) == events
    database.dispose()
