"""``binary_size``: the size of the build itself, a series per build configuration. Real builds:
a ``command`` build of a C library from a real git history whose library grows, and the two
apache-tvm releases the TVM tests use; judged by one registry entry between a run's builds,
shown by ``compare --json``, ``show``, the API and the run page, and followed by ``history
--metric binary-size`` and ``GET /api/builds/series``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import git
import pytest
import requests
from sqlalchemy import select

from conftest import live_server

from abwatch.service.cli.main import main
from abwatch.service.compare.outcome import CompareOutcome, MetricResult
from abwatch.service.config import ConfigError, load_config
from abwatch.service.store import db
from abwatch.service.stats.exact import compare_exact
from abwatch.service.store.models import Build, BuildMeasurement, Comparison, MetricMeasurement

# A shared library of FUNCS functions (each its own code: ``.text`` grows with FUNCS) and a
# benchmark that links none of them: its time is the same on every commit.
LIB_C = r"""
#include "params.h"
#define F(n) long f##n(long x) { for (int i = 0; i < (int)(x & 7) + n; i++) x = x * 31 + n; return x; }
#if FUNCS >= 1
F(1) F(2) F(3) F(4)
#endif
#if FUNCS >= 2
F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15) F(16) F(17) F(18) F(19) F(20)
F(21) F(22) F(23) F(24) F(25) F(26) F(27) F(28) F(29) F(30) F(31) F(32) F(33) F(34) F(35) F(36)
#endif
"""
BENCH_C = r"""
#include <stdio.h>
#include <time.h>
static double now_ms(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
int main(void) {
    volatile unsigned long x = 1;
    for (int s = 0; s < 5; s++) {
        double t0 = now_ms();
        for (long i = 0; i < 2000000; i++) x = x * 6364136223846793005UL + 1;
        printf("{\"runtime_ms\": %.6f}\n", now_ms() - t0);
    }
    return 0;
}
"""
BUILD_SH = "mkdir -p out && cc -O1 -shared -fPIC -o out/libgrow.so lib.c && cc -O1 -o out/bench bench.c\n"


def _history(path: Path) -> dict[str, str]:
    """v1: 4 functions; v2: 36 (the library grows); v3: a README only (the same library)."""
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "abwatch test")
        cfg.set_value("user", "email", "test@abwatch.invalid")
    (path / "lib.c").write_text(LIB_C)
    (path / "bench.c").write_text(BENCH_C)
    (path / "build.sh").write_text(BUILD_SH)
    for tag, funcs, readme in (("v1", 1, ""), ("v2", 2, ""), ("v3", 2, "docs only")):
        (path / "params.h").write_text(f"#define FUNCS {funcs}\n")
        (path / "README.md").write_text(readme)
        repo.index.add(["lib.c", "bench.c", "build.sh", "params.h", "README.md"])
        repo.index.commit(f"{tag}: {funcs}")
        repo.create_tag(tag)
    return {t.name: t.commit.hexsha for t in repo.tags}


def _config(tmp_path: Path, repo: Path, sizes: str = '["*.so"]', measure: str = '["time"]') -> str:
    path = tmp_path / "sizes.toml"
    path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
binary_size = {sizes}
[[workloads]]
name = "bench"
command = ["./bench"]
measure = {measure}
[run]
repetitions = 4
max_repetitions = 6
timeout_s = 30
noise_aware = false
instruction_repetitions = 3
counter = "valgrind"
[stats]
threshold_pct = 5.0
[runner]
device = "sizes-box"
""")
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.startswith("{") else {}


def _compare(capsys, config: str, url: str, control: str, treatment: str) -> tuple[int, dict]:
    return _run(capsys, "compare", "--config", config, "--control", control, "--treatment", treatment, "--db", url)


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_library_that_grows_is_a_binary_size_regression(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    tags = _history(repo)
    config = _config(tmp_path, repo)
    code, grew = _compare(capsys, config, sqlite_url, "v1", "v2")
    (size,) = grew["build_metrics"]
    with capsys.disabled():  # the figures, in the test log
        print(f"\nlibgrow.so .text: {size['control']:,.0f} -> {size['treatment']:,.0f} bytes "
              f"({size['change_pct']:+.1f}%)")
    assert size["metric"] == "binary_size" and size["phase"] == "build" and size["source"] == "elf .text"
    assert size["verdict"] == "regression" and size["treatment"] > size["control"] > 0
    assert size["change_pct"] == pytest.approx((size["treatment"] / size["control"] - 1) * 100)
    assert code == 1  # a regression of the build is a regression found, whatever the workload's verdict
    # the same library at the next commit (a README): the same size
    code, same = _compare(capsys, config, sqlite_url, "v2", "v3")
    (size3,) = same["build_metrics"]
    assert size3["verdict"] == "same" and size3["change_pct"] == 0 and size3["control"] == size["treatment"]
    assert code == (1 if same["results"][0]["verdict"] == "regression" else 0)

    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        (row,) = session.scalars(select(BuildMeasurement).where(BuildMeasurement.run_id == grew["run_id"])).all()
        assert (row.verdict.value, row.control_value, row.treatment_value) == ("regression", size["control"],
                                                                             size["treatment"])
        builds = {b.commit.sha: b for b in session.scalars(select(Build))}
        kept = builds[tags["v2"]].metrics["binary_size"]
        assert set(kept["files"]) == {"libgrow.so"} and kept["text_bytes"] == size["treatment"]
        assert kept["file_bytes"] == kept["files"]["libgrow.so"]["file_bytes"] > kept["text_bytes"]
        # a build stored before sizes were kept gets them when a run holds it again
        builds[tags["v1"]].metrics = {k: v for k, v in (builds[tags["v1"]].metrics or {}).items()
                                      if k != "binary_size"}
    code, again = _compare(capsys, config, sqlite_url, "v1", "v3")
    assert [b["cached"] for b in again["builds"]] == [True, True]
    assert again["build_metrics"][0]["control"] == size["control"] and again["build_metrics"][0]["verdict"] == "regression"

    # show prints it from the stored rows, in text and JSON
    code, shown = _run(capsys, "show", str(grew["run_id"]), "--db", sqlite_url)
    assert shown["build_metrics"] == grew["build_metrics"]
    capsys.readouterr()
    assert main(["show", str(grew["run_id"]), "--db", sqlite_url]) == 0
    assert "builds: binary size regression" in capsys.readouterr().out

    # the series of the build configuration: v1 < v2 = v3, in commit order
    code, history = _run(capsys, "history", "--metric", "binary-size", "--db", sqlite_url)
    assert code == 0
    (series,) = history["series"]
    assert series["builder"] == "command" and [p["sha"] for p in series["points"]] == [tags[t] for t in ("v1", "v2", "v3")]
    values = [p["value"] for p in series["points"]]
    assert values == [size["control"], size["treatment"], size["treatment"]]
    capsys.readouterr()
    assert main(["history", "--metric", "binary-size", "--db", sqlite_url]) == 0
    assert f"{int(size['treatment']):,}" in capsys.readouterr().out
    assert main(["history", "--metric", "binary-size", "--builder", "tvm-wheel", "--db", sqlite_url]) == 2
    assert main(["history", "--db", sqlite_url]) == 2  # a workload's series needs its name

    with live_server(sqlite_url, tmp_path / "serve") as base:
        report = requests.get(f"{base}/api/runs/{grew['run_id']}", timeout=30).json()
        assert report["build_metrics"] == grew["build_metrics"]
        api = requests.get(f"{base}/api/builds/series", params={"builder": "command"}, timeout=30).json()
        assert api == history
        page = requests.get(f"{base}/runs/{grew['run_id']}", timeout=30).text
    table = page[page.index('id="build-metrics"'):page.index("</table>", page.index('id="build-metrics"'))]
    assert "binary_size" in table and "regression" in table and f"{int(size['treatment']):,}" in table


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_run_that_exits_1_for_its_builds_alone_says_why_and_is_listed(tmp_path, sqlite_url, capsys):
    # the benchmark is the same code on both sides, counted: its verdict is `same`, so only the
    # library's growth can make the run exit 1, and every listing must show what did
    repo = tmp_path / "repo"
    _history(repo)
    config = _config(tmp_path, repo, measure='["instructions"]')
    capsys.readouterr()
    assert main(["compare", "--config", config, "--control", "v1", "--treatment", "v2", "--db", sqlite_url]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("exit 1: the builds themselves regressed (binary size +"), last
    assert "no workload did" in last
    (run,) = json.loads(_out(capsys, "runs", "--json", "--db", sqlite_url))
    assert run["verdicts"] == {"same": 1} and run["build_verdicts"] == {"binary_size": "regression"}
    assert "1 same; builds: binary size regression" in _out(capsys, "runs", "--db", sqlite_url)
    assert json.loads(_out(capsys, "regressions", "--json", "--db", sqlite_url)) == []  # no workload regressed
    listed = _out(capsys, "regressions", "--db", sqlite_url)
    assert "builds that regressed themselves" in listed and f"run {run['id']}: binary size +" in listed
    _, shown = _run(capsys, "show", str(run["id"]), "--db", sqlite_url)
    assert shown["exit"] == {"status": 1, "why": last}


def _out(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_without_globs_a_command_build_is_not_sized_and_a_workload_cannot_ask_for_it(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    _history(repo)
    code, payload = _compare(capsys, _config(tmp_path, repo, sizes="[]"), sqlite_url, "v1", "v2")
    assert payload["build_metrics"] == [] and code == (1 if payload["results"][0]["verdict"] == "regression" else 0)
    with pytest.raises(ConfigError, match="binary_size is a metric of the build"):
        load_config(_config(tmp_path, repo, measure='["time", "binary_size"]'))
    with pytest.raises(ConfigError, match="inside the artifacts"):
        load_config(_config(tmp_path, repo, sizes='["../*.so"]'))


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_details_keep_no_verdict_the_measurements_rows_hold(tmp_path, sqlite_url, capsys):
    """The instructions verdict lives in its ``measurements`` row; the comparison's details keep
    its profile alone, and a comparison stored with the whole verdict in details (before 0029)
    still shows it."""
    repo = tmp_path / "repo"
    _history(repo)
    code, payload = _compare(capsys, _config(tmp_path, repo, measure='["time", "instructions"]'), sqlite_url,
                             "v1", "v3")
    counted = payload["results"][0]["instructions"]
    assert counted["verdict"] in ("same", "regression", "improvement", "unknown") and counted["source"] == "valgrind"
    assert len(counted["control_counts"]) == counted["n"][0] >= 3
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        comparison = session.get(Comparison, payload["results"][0]["comparison_id"])
        assert set(comparison.details["instructions"]) == {"profile"}
        row = next(m for m in comparison.measurements if m.metric.value == "instructions")
        assert row.verdict.value == counted["verdict"] and row.control_values == counted["control_counts"]
        # as a comparison stored before 0029 was: the whole verdict in details, no row
        comparison.details = {**comparison.details, "instructions": counted}
        session.delete(row)
    code, shown = _run(capsys, "show", str(payload["run_id"]), "--db", sqlite_url)
    assert shown["results"][0]["instructions"] == counted
    with db.session_scope(engine) as session:
        assert not session.scalars(select(MetricMeasurement).where(MetricMeasurement.metric == "instructions")).all()


@pytest.mark.slow
def test_two_apache_tvm_releases_compared_by_size(capsys, tmp_path, tvm_cache, sqlite_url):
    """The libraries of the two releases the TVM tests use: both read (``.text`` of each
    ``libtvm*.so``), and the verdict is what their sizes say."""
    from tests.test_tvm import MLP, NEW, OLD, write

    code, payload = _compare(capsys, write(tmp_path, tvm_cache, MLP), sqlite_url, OLD, NEW)
    (size,) = payload["build_metrics"]
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        kept = {b.commit.sha: b.metrics["binary_size"] for b in session.scalars(select(Build))}
    for version in (OLD, NEW):
        files = ", ".join(f"{Path(name).name} .text {s['text_bytes']:,} file {s['file_bytes']:,}"
                          for name, s in kept[version]["files"].items())
        with capsys.disabled():
            print(f"\napache-tvm {version}: .text {kept[version]['text_bytes']:,} bytes; {files}")
        assert kept[version]["text_bytes"] > 1_000_000 and kept[version]["file_bytes"] > kept[version]["text_bytes"]
        assert all(Path(name).name.startswith("libtvm") for name in kept[version]["files"])
    with capsys.disabled():
        print(f"\nbinary_size {OLD} -> {NEW}: {size['change_pct']:+.2f}% ({size['verdict']}); {size['reason']}")
    assert size["source"] == "elf .text"
    assert (size["control"], size["treatment"]) == (kept[OLD]["text_bytes"], kept[NEW]["text_bytes"])
    change = (size["treatment"] / size["control"] - 1) * 100
    assert size["change_pct"] == pytest.approx(change)
    assert size["verdict"] == ("regression" if change > 1 else "improvement" if change < -1 else "same")
    if size["verdict"] == "regression":
        assert code == 1


def test_a_larger_build_is_exit_1_unless_a_workload_left_the_run_incomplete():
    """The builds are judged before any workload runs: an incomplete run says so first (4), and
    a workload's regression wins as before."""
    grew = MetricResult("binary_size", "build", compare_exact(100.0, 110.0, threshold_pct=1.0, unit="bytes"),
                        (100.0,), (110.0,), "elf .text")
    same = replace(grew, verdict=compare_exact(100.0, 100.0, threshold_pct=1.0, unit="bytes"))
    assert grew.verdict.verdict.value == "regression" and same.verdict.verdict.value == "same"
    assert CompareOutcome(1, "benchmark", "completed", [], [], (grew,)).exit_code == 1
    assert CompareOutcome(1, "benchmark", "completed", [], [], (same,)).exit_code == 0
    assert CompareOutcome(1, "benchmark", "incomplete", [], [], (grew,)).exit_code == 4
    assert CompareOutcome(1, "benchmark", "build_failed", [], [], (grew,)).exit_code == 3
    # the report's last line says which of them made the status
    assert CompareOutcome(1, "benchmark", "completed", [], [], (grew,)).exit_reason == (
        "exit 1: the builds themselves regressed (binary size +10.00%); no workload did "
        "(abwatch runs and abwatch regressions list it as a build regression)")
    assert CompareOutcome(1, "benchmark", "completed", [], [], (same,)).exit_reason == "exit 0: no regression"
    assert CompareOutcome(1, "benchmark", "incomplete", [], [], (grew,)).exit_reason.startswith("exit 4: not judged")
    assert CompareOutcome(1, "benchmark", "build_failed", [], [], (grew,)).exit_reason.startswith(
        "exit 3: a build failed")
