"""The weekly triage report (``abwatch report``, ``GET /api/report``) of a real watch history:
a watch over a real git history of the C benchmark confirms a slowdown and bisects its
culprit; the report lists it as new, confirmed and untriaged, and a triage takes it off the
untriaged list."""

from __future__ import annotations

import json
from datetime import datetime, UTC

import pytest
import requests

from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.read import triage_report
from tests.test_try import serving
from tests.test_watch import shas, step, write_watch_config

pytestmark = pytest.mark.slow  # real builds and runs


def test_the_report_of_a_real_watch_history(tmp_path, fresh_pg_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"), step("noop", "Reword the README", note="words"),
                          step("slow", "Do 15% more work in the inner loop", 1.15)))
    tags = shas(repo)
    config = write_watch_config(tmp_path, repo, 'start = "base"', threshold_pct=5.0)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1  # confirmed
    capsys.readouterr()
    assert main(["report", "--since", "7d", "--json", "--db", fresh_pg_url]) == 0
    data = json.loads(capsys.readouterr().out)
    (device,) = data["devices"]
    assert device["device"] == "bench-box" and data["counts"]["fixed"] == 0
    for name in ("new", "confirmed", "untriaged"):
        (entry,) = device[name]
        assert entry["workload"] == "loop" and entry["culprit"]["sha"] == tags["slow"] and entry["change_pct"] > 5
    assert main(["report", "--since", "7d", "--markdown", "--dashboard-url", "https://perf.example",
                 "--db", fresh_pg_url]) == 0
    markdown = capsys.readouterr().out
    with capsys.disabled():  # the docs' sample (docs/triage-report.md) is this output
        print(markdown)
    assert "### bench-box" in markdown and "**Untriaged (confirmed, no decision yet)**" in markdown
    assert f"{tags['slow'][:12]} \"Do 15% more work in the inner loop\"" in markdown
    assert f"[{entry['id']}](https://perf.example/regressions/{entry['id']})" in markdown
    # a window that ends before the history began: nothing new, the confirmed one still untriaged
    assert main(["report", "--since", "2999-01-01", "--json", "--db", fresh_pg_url]) == 0
    later = json.loads(capsys.readouterr().out)
    assert later["counts"] == {"new": 0, "confirmed": 0, "fixed": 0, "untriaged": 1}
    assert main(["report", "--since", "yesterday", "--db", fresh_pg_url]) == 2  # a usage error names it
    assert "yesterday" in capsys.readouterr().err
    assert main(["triage", str(entry["id"]), "--as", "acknowledged", "--db", fresh_pg_url]) == 0
    with (tmp_path / "serve.log").open("w") as log, serving(config, fresh_pg_url, log) as base:
        answer = requests.get(f"{base}/api/report", params={"since": "7d"}, timeout=30)
        assert answer.status_code == 200 and answer.json()["counts"]["untriaged"] == 0
        assert answer.json()["devices"][0]["confirmed"][0]["triage"] == "acknowledged"
        text = requests.get(f"{base}/api/report", params={"since": "2w", "format": "markdown"}, timeout=30)
        assert text.status_code == 200 and text.headers["content-type"].startswith("text/markdown")
        assert "| acknowledged |" in text.text
        assert requests.get(f"{base}/api/report", params={"since": "soon"}, timeout=30).status_code == 422

def test_parse_since():
    now = datetime(2025, 3, 10, 12, tzinfo=UTC)
    assert triage_report.parse_since("7d", now) == datetime(2025, 3, 3, 12, tzinfo=UTC)
    assert triage_report.parse_since("36h", now) == datetime(2025, 3, 9, 0, tzinfo=UTC)
    assert triage_report.parse_since("2025-03-01", now) == datetime(2025, 3, 1, tzinfo=UTC)
    with pytest.raises(triage_report.ReportError, match="7d"):
        triage_report.parse_since("last week", now)
