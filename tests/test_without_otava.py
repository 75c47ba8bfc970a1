"""Apache Otava (change points) is installed apart (``pip install --no-deps``); without it the
history, the series API and the trend page still answer, with the series and a note saying
how to get change points, never a 500 or an exit 5.

The processes are real ``abwatch`` processes in which importing ``otava`` fails, as on a
machine where it was never installed (a ``sitecustomize`` on their ``PYTHONPATH`` refuses it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import requests

from conftest import live_server

BLOCKER = '''
import sys


class _NoOtava:
    """Refuse to import Apache Otava, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "otava" or name.startswith("otava."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoOtava())
'''


def test_history_series_and_trend_page_work_without_apache_otava(filled_pg_url, tmp_path, monkeypatch):
    url, _ = filled_pg_url
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    monkeypatch.setenv("PYTHONPATH", str(site))
    gone = subprocess.run([sys.executable, "-c", "import otava.analysis"], capture_output=True, text=True)
    assert gone.returncode != 0 and "No module named 'otava" in gone.stderr  # the blocker works

    done = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "history", "lcg-loop", "--json",
                           "--db", url], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["series"] and shown["steps"] == [] and "apache-otava" in shown["note"]
    assert "no step changes" in done.stderr

    with live_server(url, tmp_path / "srv") as base:
        series = requests.get(base + "/api/workloads/lcg-loop/series", timeout=30)
        assert series.status_code == 200
        data = series.json()
        assert "apache-otava" in data["note"]
        assert data["devices"] and all(d["points"] and d["change_points"] == [] for d in data["devices"])
        page = requests.get(base + "/workloads/lcg-loop", timeout=30)
        assert page.status_code == 200 and "apache-otava" in page.text
