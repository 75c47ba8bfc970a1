"""Packaging: the wheel installs one ``abwatch`` package, and the change-point algorithm runs
without Apache Otava's integrations (installed with ``--no-deps``)."""

from __future__ import annotations

import pytest
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_wheel_installs_only_the_abwatch_namespace(tmp_path):
    """Build the real wheel (pip, isolated build) and install it into an empty target."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, text=True)
    [wheel] = list((tmp_path / "dist").glob("abwatch-*.whl"))
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top == {"abwatch", wheel.name.split("-py3")[0] + ".dist-info"}, top
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    # pip --target puts console scripts in bin/; everything else is the site-packages content
    assert {p.name for p in target.iterdir()} - {"bin"} == {"abwatch", wheel.name.split("-py3")[0] + ".dist-info"}
    assert (target / "abwatch/migrations/versions/0001_initial_schema.py").exists()
    assert (target / "abwatch/migrations/script.py.mako").exists()
    probe = f"""
import importlib.util, json, sys
sys.path.insert(0, {str(target)!r})
import abwatch.service.cli.main, abwatch.builders, abwatch.runners, abwatch.core, abwatch.migrations
from abwatch.service.store import db
db.upgrade("sqlite:///" + {str(tmp_path / "x.db")!r})  # the migrations ship in the package
print(json.dumps({{"cli": abwatch.service.cli.main.__file__,
                  "flat": [n for n in ("service", "builders", "runners", "core", "migrations")
                           if importlib.util.find_spec(n) is not None]}}))
"""
    # run outside the source tree, so only the installed copy can be found
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["cli"].startswith(str(target)) and found["flat"] == []
    entry_points = next(target.glob("abwatch-*.dist-info")) / "entry_points.txt"
    assert "abwatch = abwatch.service.cli.main:main" in entry_points.read_text()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_change_points_need_none_of_otavas_integrations():
    """The same steps come out when Otava's integrations (and its other declared dependencies)
    cannot be imported at all, as in an install with ``--no-deps``."""
    blocked = ["google", "grpc", "slack_sdk", "pg8000", "dateparser", "configargparse", "ruamel",
               "pystache", "tabulate", "validators", "dateutil", "pytz", "tzlocal", "regex"]
    script = f"""
import json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from abwatch.service import stats
import numpy as np
rng = np.random.default_rng(3)
series = list(100 + rng.normal(0, 1, 30)) + list(110 + rng.normal(0, 1, 30))
print(json.dumps([[s.index, s.change_pct, s.p_value] for s in stats.change_points(series)]))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps_line, modules_line = done.stdout.splitlines()
    assert json.loads(modules_line) == []
    import numpy as np

    from abwatch.service import stats

    rng = np.random.default_rng(3)
    series = list(100 + rng.normal(0, 1, 30)) + list(110 + rng.normal(0, 1, 30))
    here = [[s.index, s.change_pct, s.p_value] for s in stats.change_points(series)]
    assert json.loads(steps_line) == here and here and here[0][0] == 30


def test_pyproject_leaves_otava_and_its_integrations_out():
    text = (ROOT / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "otava" not in dependencies and "bigquery" not in dependencies
    assert "--no-deps 'apache-otava==0.8.0'" in (ROOT / "scripts/quickstart.sh").read_text()
