"""Triage from the command line: decisions stored beside the state history, shown apart."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from abwatch.service.read import queries
from abwatch.service.store import db
from abwatch.service.cli.main import main


def test_triage_command_stores_who_when_why_and_sets_invalid_apart(write_config, capsys, monkeypatch, sqlite_url):
    url = sqlite_url
    config = write_config(repetitions=6)
    assert main(["compare", "--config", str(config), "--control", "noop", "--treatment", "slower",
                 "--json", "--db", url]) == 1
    regression_id = json.loads(capsys.readouterr().out)["results"][0]["regression_id"]
    assert regression_id is not None
    monkeypatch.setenv("USER", "ana")
    assert main(["triage", str(regression_id), "--as", "acknowledged", "--db", url]) == 0
    assert main(["triage", str(regression_id), "--as", "invalid", "--issue", "https://bugs.example/42",
                 "--note", "the machine was busy", "--who", "bo", "--db", url]) == 0
    assert f"regression {regression_id} (loop): triaged as invalid" in capsys.readouterr().out

    engine = db.make_engine(url)
    with db.session_scope(engine) as session:
        detail = queries.regression_detail(session, regression_id)
        assert detail["state"] == "benchmark" and detail["triage"] == "invalid"
        assert [(t["status"], t["who"], t["issue_url"], t["note"]) for t in detail["triage_events"]] == [
            ("acknowledged", "ana", None, ""),
            ("invalid", "bo", "https://bugs.example/42", "the machine was busy")]
        assert len(detail["events"]) == 1  # the state history is untouched
        overview = queries.overview(session)
        assert overview["open_regressions"] == []
        assert [r["id"] for r in overview["silenced_regressions"]] == [regression_id]
        assert session.execute(text("SELECT triage FROM regression_history")).scalar_one() == "invalid"
        assert session.execute(text("SELECT open_regressions FROM latest_status")).scalar_one() == 0
    engine.dispose()

    # fixed by a later commit: the commit is kept, and the regression stays apart from the open ones
    assert main(["triage", str(regression_id), "--as", "wontfix", "--fixed-by", "abc1234", "--db", url]) == 2
    assert "goes with `fixed`" in capsys.readouterr().err
    assert main(["triage", str(regression_id), "--as", "fixed", "--fixed-by", "no-sha", "--db", url]) == 2
    assert main(["triage", str(regression_id), "--as", "acknowledged", "--db", url]) == 0
    with db.session_scope(engine) as session:  # acknowledged: open again, counted by the view
        assert session.execute(text("SELECT open_regressions FROM latest_status")).scalar_one() == 1
    assert main(["triage", str(regression_id), "--as", "fixed", "--fixed-by", "abc1234def", "--db", url]) == 0
    assert f"regression {regression_id} (loop): triaged as fixed by abc1234def" in capsys.readouterr().out
    with db.session_scope(engine) as session:
        detail = queries.regression_detail(session, regression_id)
        assert (detail["triage"], detail["fixed_by"]) == ("fixed", "abc1234def")
        assert [(t["status"], t["fixed_by"]) for t in detail["triage_events"]][-2:] == [
            ("acknowledged", None), ("fixed", "abc1234def")]
        overview = queries.overview(session)
        assert overview["open_regressions"] == [] and overview["silenced_regressions"][0]["fixed_by"] == "abc1234def"
        assert session.execute(text("SELECT open_regressions FROM latest_status")).scalar_one() == 0
        assert session.execute(text("SELECT fixed_by FROM triage_events WHERE status = 'fixed'")).scalar_one() == "abc1234def"
    engine.dispose()

    assert main(["triage", "9999", "--as", "expected", "--db", url]) == 2
    assert "regression 9999 does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["triage", str(regression_id), "--as", "ignored", "--db", url])
