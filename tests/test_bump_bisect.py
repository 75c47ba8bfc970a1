"""Bisection on into a submodule bump: a TVM-shaped project (tests/test_tvm_source.py's shape)
whose ``3rdparty/tvm-ffi`` submodule, reached through ``submodule_rewrites``, is moved over 8
commits by one bump commit; one of them makes the C workload 10 % slower. Real git, real CMake +
Ninja + ccache builds, real PostgreSQL; the workload is measured by the instructions it retires
(Valgrind), so the verdicts do not hang on the busy machine's load.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import git
import pytest
import requests
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from abwatch.builders import BuildFailed, TvmSourceBuilder
from abwatch.builders.builder import SubmodulePin
from abwatch.builders.repo import RepoMirror
from abwatch.builders.spec import ARTIFACT_INFO
from abwatch.service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig
from abwatch.service.cli.main import main
from abwatch.service.store import db
from abwatch.service.stats.verdict import Direction, RegressionState
from abwatch.service.store.models import AlertDelivery, BisectionStep, Build, BuildStatus, Regression
from abwatch.service.watch import bisect, bisect_search
from conftest import live_server
from test_sql import sql_blocks

FAKE_REMOTE = "https://example.invalid/apache/"
FFI = "3rdparty/tvm-ffi"

CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(tvmshaped C CXX)
if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/config.cmake)
  include(${CMAKE_CURRENT_BINARY_DIR}/config.cmake)
endif()
include_directories(3rdparty/tvm-ffi/include)
add_library(tvm_runtime SHARED src/runtime.cc)
add_executable(bench src/bench.c)
target_link_libraries(bench tvm_runtime)
"""
# the hot path's work per call comes from the submodule's header, as tvm-ffi's inline code does
RUNTIME = ('#include "ffi_work.h"\n'
           'extern "C" long tvm_work(long n) {{ volatile long acc = 0; '
           'for (long i = 0; i < n * FFI_WORK; ++i) acc += i{extra}; return acc; }}\n')
BENCH = ('#include <stdlib.h>\nlong tvm_work(long n);\n'
         'int main(int argc, char **argv) { return tvm_work(atol(argv[1])) == -1; }\n')
HEADER = "/* {note} */\n#define FFI_WORK {work}\n{broken}"


def _commit(repo: git.Repo, message: str, *paths: str) -> str:
    repo.git.add("--", *paths)
    repo.git.execute(["git", "-c", "user.name=test", "-c", "user.email=test@abwatch.invalid",
                      "commit", "--quiet", "-m", message])
    return repo.head.commit.hexsha


def _ffi_history(root: Path, after: int = 110) -> tuple[git.Repo, list[str]]:
    """tvm-ffi: its first commit, then 8 more; the 4th does not compile, the 5th (which fixes it)
    does 10 % more work per call (``after`` = 110; 90: 10 % less)."""
    ffi = git.Repo.init(root / "mirrors" / "tvm-ffi", initial_branch="main")
    header = Path(ffi.working_dir) / "include" / "ffi_work.h"
    header.parent.mkdir()
    change = f"Do {abs(after - 100)}% {'more' if after > 100 else 'less'} work per call"
    plan = [("first", 100, ""), ("Tidy 1", 100, ""), ("Tidy 2", 100, ""), ("Tidy 3", 100, ""),
            ("Break the header", 100, "this is not C;\n"), (change, after, ""),
            ("Tidy 6", after, ""), ("Tidy 7", after, ""), ("Tidy 8", after, "")]
    shas = []
    for note, work, broken in plan:
        header.write_text(HEADER.format(note=note, work=work, broken=broken))
        shas.append(_commit(ffi, note, "include"))
    return ffi, shas


def _project(root: Path, ffi_pin: str) -> git.Repo:
    repo = git.Repo.init(root / "tvm", initial_branch="main")
    work = Path(repo.working_dir)
    (work / "src").mkdir()
    (work / "CMakeLists.txt").write_text(CMAKELISTS)
    (work / "src" / "runtime.cc").write_text(RUNTIME.format(extra=""))
    (work / "src" / "bench.c").write_text(BENCH)
    (work / ".gitmodules").write_text(f'[submodule "tvm-ffi"]\n\tpath = {FFI}\n\turl = {FAKE_REMOTE}tvm-ffi\n')
    repo.git.update_index("--add", "--cacheinfo", f"160000,{ffi_pin},{FFI}")
    _commit(repo, "first", "CMakeLists.txt", "src", ".gitmodules")
    return repo


def _bump(repo: git.Repo, pin: str, also_tvm: bool, extra: str = " /* adapted to the new FFI */") -> str:
    work = Path(repo.working_dir)
    repo.git.update_index("--cacheinfo", f"160000,{pin},{FFI}")
    if also_tvm:  # a TVM change in the bump: by default one that costs nothing measurable
        (work / "src" / "runtime.cc").write_text(RUNTIME.format(extra=extra))
    return _commit(repo, "[FFI] Bump tvm-ffi", "src")


def _tidy(repo: git.Repo, note: str) -> str:
    (Path(repo.working_dir) / "README").write_text(note)
    return _commit(repo, f"README: {note}", "README")


def _config(tmp_path: Path, root: Path, repo: git.Repo, watch: str = "") -> str:
    path = tmp_path / "watch.toml"
    path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(repo.working_dir)}
[build]
kind = "tvm-source"
cmake = {{USE_LLVM = "OFF"}}
python_packages = []
check_import = ""
submodules = ["{FFI}"]
submodule_rewrites = {{{json.dumps(FAKE_REMOTE)} = {json.dumps(str(root / 'mirrors') + '/')}}}
libraries = ["*.so", "bench"]
[[workloads]]
name = "loop"
command = ["lib/bench", "20000"]
measure = ["instructions"]
[run]
repetitions = 5
max_repetitions = 20
timeout_s = 60
noise_aware = false
[stats]
threshold_pct = 1.0
[runner]
device = "bench-box"
[watch]
control = "previous"
{watch}
[alerts]
webhooks = ["http://127.0.0.1:9/hook"]
timeout_s = 1.0
attempts = 1
""")
    return str(path)


def _regressions(url: str, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["regressions", "--json", "--db", url]) == 0
    return json.loads(capsys.readouterr().out)


def test_bump_range_and_its_culprit():
    pure = bisect_search.bump_range(FFI, "o", ["a", "b", "c"], pure=True)
    assert pure.commits == ("a", "b", "c") and pure.culprit(0) == "a"
    mixed = bisect_search.bump_range(FFI, "o", ["a", "b", "c"], pure=False)
    # the old pin at the bump comes first: found bad, the bump's TVM files are the culprit
    assert mixed.commits == ("o", "a", "b", "c") and mixed.culprit(0) is None and mixed.culprit(1) == "a"
    assert bisect.rewritten(f"{FAKE_REMOTE}tvm-ffi", {FAKE_REMOTE: "/m/", "https://": "/x/"}) == "/m/tvm-ffi"
    assert bisect.rewritten("git@host:a", {FAKE_REMOTE: "/m/"}) == "git@host:a"


def test_a_step_into_a_bump_pins_the_side_it_builds():
    """Against the parent: the bump with the submodule moved. Undecided, against the bump: the
    parent with it moved when the bump is pure (the same tree); no such build for a bump that
    changes TVM's files too (None: the step keeps the earlier suspect)."""
    calls = []

    def compare(names, control, treatment, pin=None):
        calls.append((control, treatment, pin))
        return "compared"

    pin = SubmodulePin(FFI, "c" * 40)
    pure = bisect._Moved(pin, None, "parent", pure=True).compare(compare)
    assert pure({"w"}, "parent", "bump") == "compared" and calls[-1] == ("parent", "bump", ("bump", pin))
    assert pure({"w"}, "bump", "bump") == "compared" and calls[-1] == ("parent", "bump", ("parent", pin))
    mixed = bisect._Moved(pin, None, "parent", pure=False).compare(compare)
    assert mixed({"w"}, "bump", "bump") is None and len(calls) == 2
    assert pin.describe == f"{FFI}@{'c' * 40}"


def test_bumps_read_from_git(tmp_path):
    _, ffi = _ffi_history(tmp_path)
    repo = _project(tmp_path, ffi[0])
    pure, mixed = _bump(repo, ffi[8], also_tvm=False), _bump(repo, ffi[0], also_tvm=True)
    mirror = RepoMirror(repo.working_dir, tmp_path / "cache")
    [bump] = bisect.bumps(mirror, pure, [FFI])
    assert (bump.path, bump.old, bump.new, bump.url, bump.pure) == (FFI, ffi[0], ffi[8], f"{FAKE_REMOTE}tvm-ffi", True)
    assert not bisect.bumps(mirror, pure, [])  # not a [build] submodules entry: not gone into
    [back] = bisect.bumps(mirror, mixed, [FFI])
    assert not back.pure and back.new == ffi[0]
    assert not bisect.bumps(mirror, repo.git.rev_parse("HEAD~2"), [FFI])  # the first commit: no parent


@pytest.mark.slow
@pytest.mark.parametrize("also_tvm", [False, True], ids=["pure-bump", "bump-with-tvm-changes"])
def test_watch_names_the_bump_and_the_submodule_commit(tmp_path, fresh_pg_url, capsys, also_tvm):
    root = tmp_path / "src"
    _, ffi = _ffi_history(root)
    repo = _project(root, ffi[0])
    config = _config(tmp_path, root, repo)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # the baseline
    bump = _bump(repo, ffi[8], also_tvm)
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1  # confirmed, bisected
    said = capsys.readouterr()
    [found] = _regressions(fresh_pg_url, capsys)
    assert found["culprit"]["sha"] == bump and found["culprit"]["summary"] == "[FFI] Bump tvm-ffi"
    sub = found["culprit"]["submodule"]
    assert sub["path"] == FFI and sub["sha"] == ffi[5] and sub["summary"] == "Do 10% more work per call"
    assert found["culprit_line"] == (f"culprit: {bump[:12]} [FFI] Bump tvm-ffi -> {FFI} {ffi[5][:12]} "
                                     "Do 10% more work per call")
    told = said.err + said.out
    assert f"at most {4 + also_tvm} builds" in told  # 8 commits, or 9 with the old pin
    assert f"{bump[:12]} with {FFI} at {ffi[4][:12]}: skip (does not build)" in told
    engine = db.make_engine(fresh_pg_url)
    with Session(engine) as session:
        pinned = session.scalars(select(Build).where(Build.submodule_pin.is_not(None))).all()
        # at most ceil(log2 8) + 1 builds of the submodule's commits; the broken one skipped
        assert len(pinned) <= 4
        assert {b.submodule_pin for b in pinned if b.status == BuildStatus.BUILD_FAILED} == {f"{FFI}@{ffi[4]}"}
        assert all(b.commit.sha == bump for b in pinned)  # TVM at the bump, the submodule moved
        assert len({b.artifact_key for b in pinned if b.artifact_key}) == len([b for b in pinned if b.artifact_key])
        # the alert of the one-commit range names the bump and the submodule commit (port 9 refuses it)
        [alert] = session.scalars(select(AlertDelivery).where(AlertDelivery.event == "regress")).all()
        assert f"{bump[:12]} \"[FFI] Bump tvm-ffi\" -> {FFI} {ffi[5][:12]}" in alert.payload["text"]
        steps = session.scalars(select(BisectionStep).where(BisectionStep.submodule_commit_id.is_not(None))).all()
        assert {s.submodule_commit.sha: s.side.value for s in steps}[ffi[5]] == "bad"
        if also_tvm:  # the old pin at the bump was tested first: it is good
            assert {s.submodule_commit.sha: s.side.value for s in steps}.get(ffi[0]) in ("good", None)
    with engine.connect() as connection:  # docs/sql.md's query of the submodule culprits
        [row] = connection.execute(text(sql_blocks()[-1])).mappings().all()
        assert (row["culprit_sha"], row["path"], row["submodule_sha"]) == (bump, FFI, ffi[5])
        assert 1 <= row["submodule_steps"] <= 4
    capsys.readouterr()
    assert main(["regressions", "--db", fresh_pg_url]) == 0
    assert found["culprit_line"] in capsys.readouterr().out
    assert main(["report", "--since", "7d", "--markdown", "--db", fresh_pg_url]) == 0  # the weekly report
    assert f"-> {FFI} {ffi[5][:12]} \"Do 10% more work per call\"" in capsys.readouterr().out
    with live_server(fresh_pg_url, tmp_path / "serve") as base:  # the API's JSON and the regression's page
        api = requests.get(f"{base}/api/regressions/{found['id']}", timeout=30).json()
        assert api["culprit"]["submodule"]["sha"] == ffi[5]
        page = requests.get(f"{base}/regressions/{found['id']}", timeout=30).text
        assert f'<code id="culprit-submodule">{ffi[5][:12]}</code>' in page and "Do 10% more work per call" in page


@pytest.mark.slow
def test_an_improvement_inside_a_bump_is_bisected_to_its_submodule_commit(tmp_path, sqlite_url, capsys):
    # [watch] bisect = [..., "improvement"]: a confirmed speed-up from a bump is bisected on into
    # the submodule like a slowdown, and named as its cause; nothing calls it a regression
    root = tmp_path / "src"
    _, ffi = _ffi_history(root, after=90)
    repo = _project(root, ffi[0])
    config = _config(tmp_path, root, repo, watch='bisect = ["regression", "improvement"]')
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0  # the baseline
    bump = _bump(repo, ffi[8], also_tvm=False)
    assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 0  # an improvement: no failure
    assert _regressions(sqlite_url, capsys) == []
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        [found] = session.scalars(select(Regression)).all()
        assert found.direction is Direction.FASTER and found.state == RegressionState.REGRESS
        assert found.culprit_commit.sha == bump
        assert (found.culprit_submodule_path, found.culprit_submodule_commit.sha) == (FFI, ffi[5])
        assert found.culprit_submodule_commit.summary == "Do 10% less work per call"
        pinned = session.scalars(select(Build).where(Build.submodule_pin.is_not(None))).all()
        assert len(pinned) <= 4  # ceil(log2 8) + 1, the broken commit among them
        [alert] = session.scalars(select(AlertDelivery).where(AlertDelivery.event == "culprit")).all()
        assert "faster" in alert.payload["text"] and ffi[5][:12] in alert.payload["text"]
    engine.dispose()
    capsys.readouterr()
    assert main(["regressions", "--improvements", "--db", sqlite_url]) == 0
    assert f"{FFI} {ffi[5][:12]}" in capsys.readouterr().out


@pytest.mark.slow
def test_a_pinned_submodule_is_its_own_build(tmp_path):
    """TVM at the bump with tvm-ffi at one of the bump's commits: another cache key and artifact
    (saying its pin), the submodule at that commit in the build, the plain build unchanged after."""
    root = tmp_path / "src"
    _, ffi = _ffi_history(root)
    repo = _project(root, ffi[0])
    bump = _bump(repo, ffi[8], also_tvm=False)

    def builder(submodules):
        return TvmSourceBuilder(Config(
            repo=RepoConfig(url=repo.working_dir), cache_dir=tmp_path / "cache",
            build=TvmSourceBuildConfig(cmake={"USE_LLVM": "OFF"}, python_packages=[], check_import="",
                                       submodules=submodules, libraries=["*.so", "bench"],
                                       submodule_rewrites={FAKE_REMOTE: f"{root / 'mirrors'}/"}),
            workloads=[CommandWorkloadConfig(name="w", command=["true"])]))

    with pytest.raises(ValueError, match="not one of"):  # only a submodule the build checks out
        builder(None).pin_submodule(bump, SubmodulePin(FFI, ffi[2]))
    plain_builder, pinned_builder = builder([FFI]), builder([FFI])
    pinned_builder.pin_submodule(bump, SubmodulePin(FFI, ffi[2]))
    assert pinned_builder.submodule_pin(bump) == SubmodulePin(FFI, ffi[2]) and plain_builder.submodule_pin(bump) is None
    assert pinned_builder.cache_key(bump) != plain_builder.cache_key(bump)
    pinned = pinned_builder.build(plain_builder.resolve(bump).sha)
    assert json.loads((pinned.path / ARTIFACT_INFO).read_text())["submodule_pin"] == f"{FFI}@{ffi[2]}"
    assert f"{FFI} moved to {ffi[2]}" in pinned.log
    plain = plain_builder.build(bump)  # the workspace's submodule back at the bump's own pin
    assert plain.path != pinned.path and "moved to" not in plain.log
    assert f"{FFI}@" not in (plain.path / ARTIFACT_INFO).read_text()
    src = plain_builder.workspace / "src" / FFI
    head = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert head == ffi[8]
    pinned_builder.pin_submodule(bump, SubmodulePin(FFI, "0" * 40))  # not in the mirror: the build fails
    with pytest.raises(BuildFailed, match=f"fetch of {FFI} 000000000000 failed"):
        pinned_builder.build(bump)


@pytest.mark.slow
def test_a_bump_inside_a_range_and_a_bump_whose_own_tvm_change_is_the_culprit(tmp_path, fresh_pg_url, capsys):
    """A bump between two other commits is found by the branch's bisection (its parent found
    good), then bisected into; a bump whose own TVM change makes the workload slower is bisected
    with TVM at the bump, whose old pin is slower already: no tvm-ffi commit is named."""
    root = tmp_path / "src"
    _, ffi = _ffi_history(root)
    repo = _project(root, ffi[0])
    config = _config(tmp_path, root, repo)
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 0  # the baseline
    _tidy(repo, "one")
    bump = _bump(repo, ffi[8], also_tvm=False)
    _tidy(repo, "two")
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    [found] = _regressions(fresh_pg_url, capsys)
    assert found["culprit"]["sha"] == bump and found["culprit"]["submodule"]["sha"] == ffi[5]

    # the bump's TVM side does 25 % more work (the same tvm-ffi move rides along): back to the old
    # pin first, so that the next bump moves tvm-ffi again
    repo.git.update_index("--cacheinfo", f"160000,{ffi[0]},{FFI}")
    _commit(repo, "Revert the tvm-ffi bump", "README")
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) in (0, 1)
    slower = _bump(repo, ffi[8], also_tvm=True, extra=" + (i % 3) - 1")
    capsys.readouterr()
    assert main(["watch", "--config", config, "--once", "--db", fresh_pg_url]) == 1
    latest = max(_regressions(fresh_pg_url, capsys), key=lambda r: r["id"])
    assert latest["culprit"]["sha"] == slower and latest["culprit"]["submodule"] is None
    assert any("the bump's own changes to TVM's files are the culprit" in e["reason"] for e in latest["events"])
