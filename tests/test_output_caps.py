"""A workload that prints without bound: each invocation's output and samples are capped while
they are read, and passing a cap is an error of that workload (never a verdict, never partial
samples stored), naming the cap and the key that raises it."""

from __future__ import annotations

import pytest
import json
import textwrap
from pathlib import Path

import git
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.store.models import Comparison, Run, Sample, Workload

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

SPEW = textwrap.dedent("""
    import os, sys
    lines, pad = int(os.environ["LINES"]), int(os.environ.get("PAD", "0"))
    line = json.dumps({"runtime_ms": 1.0, "pad": "x" * pad}) + "\\n"
    sys.stdout.write(line * lines)
""").replace("import os, sys", "import json, os, sys")


def _repo(path):
    path.mkdir()
    (path / "spew.py").write_text(SPEW)
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@t.invalid")
    repo.index.add(["spew.py"])
    repo.index.commit("spew")
    repo.create_tag("v1")
    (path / "README").write_text("words\n")
    repo.index.add(["README"])
    repo.index.commit("words")
    repo.create_tag("v2")


def test_output_and_sample_caps_end_the_workload_with_an_error_and_keep_nothing(tmp_path, capsys, sqlite_url):
    _repo(tmp_path / "repo")
    config = tmp_path / "caps.toml"
    workloads = {
        # 10 MB of valid JSON lines against a 1 MB cap
        "over-bytes": ('{LINES = "40000", PAD = "240"}', "max_output_mb = 1"),
        "over-samples": ('{LINES = "1001"}', "max_samples = 1000"),
        "at-cap": ('{LINES = "1000"}', "max_samples = 1000"),
    }
    config.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(tmp_path / 'repo'))}
[build]
command = ["sh", "-c", "mkdir -p out && cp spew.py out/"]
artifacts = "out"
[run]
repetitions = 4
warmup = 0
timeout_s = 60
max_seconds = 60
noise_aware = false
[stats]
contention_share = 0  # the samples are constants, not timings: judged as printed, however busy the machine
""" + "".join(f"""
[[workloads]]
name = "{name}"
command = ["python3", "spew.py"]
env = {env}
{cap}
""" for name, (env, cap) in workloads.items()))
    url = sqlite_url
    code = main(["compare", "--config", str(config), "--control", "v1", "--treatment", "v2", "--json", "--db", url])
    assert code == 4  # incomplete: two workloads could not be judged
    report = json.loads(capsys.readouterr().out)
    results = {r["workload"]: r for r in report["results"]}
    assert results["over-bytes"]["verdict"] == "unknown"
    assert "printed more than 1048576 bytes" in results["over-bytes"]["failure"]
    assert "workloads.over-bytes.max_output_mb" in results["over-bytes"]["failure"]
    assert results["over-samples"]["verdict"] == "unknown"
    assert "more than 1000 samples" in results["over-samples"]["failure"]
    assert results["at-cap"]["failure"] is None and results["at-cap"]["verdict"] != "unknown"

    engine = db.make_engine(url)
    with Session(engine) as session:
        stored = dict(session.execute(
            select(Workload.name, func.count(Sample.id)).join(Sample, Sample.workload_id == Workload.id, isouter=True)
            .group_by(Workload.name)).all())
        assert stored["over-bytes"] == 0 and stored["over-samples"] == 0  # nothing partial kept
        assert stored["at-cap"] == 1000 * 2 * 4
        run = session.scalars(select(Run)).one()
        assert session.scalar(select(func.count()).select_from(Comparison).where(Comparison.run_id == run.id)) == 3
    engine.dispose()
    assert Path(sqlite_url.removeprefix("sqlite:///")).stat().st_size < 5 * 2**20
