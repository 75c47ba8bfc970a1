"""The tvm-source builder on a small CMake project with TVM's shape, made in the test.

The project has TVM's layout: a ``CMakeLists.txt`` that reads ``config.cmake`` from the build
directory, ``libtvm_runtime.so`` and ``libtvm.so``, a ``python/`` package that loads them from
``TVM_LIBRARY_PATH``, and a ``3rdparty/tvm-ffi`` submodule (whose header the runtime needs)
reached through a URL rewrite. Real git, real CMake + Ninja + ccache, real compiler.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import git
import pytest
from sqlalchemy import select

from abwatch.builders import BuildFailed, TvmSourceBuilder
from abwatch.builders.environment import build_python
from abwatch.builders.spec import ARTIFACT_INFO
from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig
from abwatch.service.store.models import Build, BuildStatus

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

FAKE_REMOTE = "https://example.invalid/apache/"

CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(tvmshaped CXX)
if(EXISTS ${CMAKE_CURRENT_BINARY_DIR}/config.cmake)
  include(${CMAKE_CURRENT_BINARY_DIR}/config.cmake)
endif()
include_directories(3rdparty/tvm-ffi/include)
add_library(tvm_runtime SHARED src/runtime.cc)
add_library(tvm SHARED src/compiler.cc)
target_link_libraries(tvm tvm_runtime)
"""
RUNTIME = '#include "tvmffi_magic.h"\nextern "C" int runtime_magic() { return FFI_MAGIC; }\n'
COMPILER = ('extern "C" int runtime_magic();\n#define VERSION {v}\n#ifndef BONUS\n#define BONUS 0\n#endif\n'
            'extern "C" int compiler_version() {{ return VERSION + runtime_magic() + BONUS; }}\n')
PYTHON = '''"""tvmshaped: loads its libraries from TVM_LIBRARY_PATH, as TVM does.{doc}"""
import ctypes, os
_dir = os.environ["TVM_LIBRARY_PATH"]
ctypes.CDLL(os.path.join(_dir, "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
_lib = ctypes.CDLL(os.path.join(_dir, "libtvm.so"))
def version():
    return _lib.compiler_version()
'''


def _commit(repo: git.Repo, message: str) -> str:
    # the git CLI, and only the project's files: the submodule's gitlink entry must stay
    repo.git.add("--", *[p.name for p in Path(repo.working_dir).iterdir() if p.name not in (".git", "3rdparty")])
    repo.git.execute(["git", "-c", "user.name=test", "-c", "user.email=test@abwatch.invalid",
                      "commit", "--quiet", "-m", message])
    return repo.head.commit.hexsha


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(repo path, mirrors dir, {name: sha}) of the TVM-shaped project's history."""
    root = tmp_path_factory.mktemp("tvmshaped")
    ffi = git.Repo.init(root / "mirrors" / "tvm-ffi.git".removesuffix(".git"), initial_branch="main")
    (Path(ffi.working_dir) / "include").mkdir()
    (Path(ffi.working_dir) / "include" / "tvmffi_magic.h").write_text("#define FFI_MAGIC 42\n")
    ffi_sha = _commit(ffi, "ffi header")
    ffi.create_tag("v0.1.7")

    repo = git.Repo.init(root / "tvm", initial_branch="main")
    work = Path(repo.working_dir)
    (work / "src").mkdir()
    (work / "python" / "tvmshaped").mkdir(parents=True)
    (work / "CMakeLists.txt").write_text(CMAKELISTS)
    (work / "src" / "runtime.cc").write_text(RUNTIME)
    (work / "src" / "compiler.cc").write_text(COMPILER.format(v=1))
    (work / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON.format(doc=""))
    (work / ".gitmodules").write_text(f'[submodule "3rdparty/tvm-ffi"]\n\tpath = 3rdparty/tvm-ffi\n'
                                      f"\turl = {FAKE_REMOTE}tvm-ffi\n")
    repo.git.update_index("--add", "--cacheinfo", f"160000,{ffi_sha},3rdparty/tvm-ffi")
    shas = {"first": _commit(repo, "first")}
    (work / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON.format(doc=" Python-only change."))
    shas["python_only"] = _commit(repo, "python only")
    (work / "src" / "compiler.cc").write_text(COMPILER.format(v=2))
    shas["compiler"] = _commit(repo, "compiler change")
    (work / "src" / "compiler.cc").write_text("this is not C++;\n")
    shas["broken"] = _commit(repo, "broken")
    return work, root / "mirrors", shas


def make_config(project, cache: Path, **build) -> Config:
    work, mirrors, _ = project
    options = {"cmake": {"USE_LLVM": "OFF"}, "python_packages": [], "check_import": "",
               "submodule_rewrites": {FAKE_REMOTE: f"{mirrors}/"}, **build}
    return Config(repo=RepoConfig(url=str(work)), cache_dir=cache, build=TvmSourceBuildConfig(**options),
                  workloads=[CommandWorkloadConfig(name="w", command=["true"])])


def run_python(artifact: Path, code: str) -> str:
    info = json.loads((artifact / ARTIFACT_INFO).read_text())
    env = dict(os.environ, **{k: str(artifact / v) for k, v in info["env_paths"].items()})
    return subprocess.run([str(build_python(artifact)), "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_clean_then_cached_then_incremental_and_shared(project, tmp_path):
    _, _, shas = project
    builder = TvmSourceBuilder(make_config(project, tmp_path))
    first = builder.build(builder.resolve("main~3").sha)
    assert not first.cached and first.metrics["incremental"] is False and first.metrics["steps"] >= 4
    assert sorted(p.name for p in (first.path / "lib").iterdir()) == ["libtvm.so", "libtvm_runtime.so"]
    # the submodule came through the URL rewrite: its header's 42 is compiled in
    assert run_python(first.path, "import tvmshaped; print(tvmshaped.version())").strip() == "43"
    assert "Build files have been written" in first.log

    again = builder.build(shas["first"])
    assert again.cached and again.path == first.path

    python_only = builder.build(shas["python_only"])
    assert python_only.metrics["incremental"] is True and python_only.metrics["steps"] == 0
    # unchanged libraries are the same file on disk (content-addressed, hard-linked)
    for name in ("libtvm.so", "libtvm_runtime.so"):
        assert (python_only.path / "lib" / name).stat().st_ino == (first.path / "lib" / name).stat().st_ino
    assert "Python-only change" in (python_only.path / "python" / "tvmshaped" / "__init__.py").read_text()

    compiler = builder.build(shas["compiler"])
    assert compiler.metrics["incremental"] is True and 1 <= compiler.metrics["steps"] <= 2
    assert run_python(compiler.path, "import tvmshaped; print(tvmshaped.version())").strip() == "44"
    one_build = sum(p.stat().st_size for p in first.path.rglob("*") if p.is_file())
    assert builder.cache.size_bytes() <= 2.5 * one_build  # three artifacts, one changed library


def test_relinked_library_of_an_older_build_is_packed_and_rebuilt(project, tmp_path):
    """The older build's changed libtvm.so becomes a delta; using that build again restores it."""
    _, _, shas = project
    builder = TvmSourceBuilder(make_config(project, tmp_path))
    builder.cache.delta_min_bytes = 0  # the test project's libraries are a few KB
    first = builder.build(shas["first"])
    builder.build(shas["compiler"])
    assert not (first.path / "lib" / "libtvm.so").exists()  # packed: changed between the two
    assert (first.path / "lib" / "libtvm_runtime.so").exists()  # unchanged: shared, never packed
    again = builder.build(shas["first"])
    assert again.cached and run_python(again.path, "import tvmshaped; print(tvmshaped.version())").strip() == "43"

    unpacked = TvmSourceBuilder(make_config(project, tmp_path / "off", pack_deltas=False))
    unpacked.cache.delta_min_bytes = 0
    kept = unpacked.build(shas["first"])
    unpacked.build(shas["compiler"])
    assert (kept.path / "lib" / "libtvm.so").exists()


def test_ccache_is_shared_across_build_configurations(project, tmp_path):
    _, _, shas = project
    TvmSourceBuilder(make_config(project, tmp_path)).build(shas["first"])
    other = TvmSourceBuilder(make_config(project, tmp_path, cmake={"USE_LLVM": "OFF", "EXTRA_FLAG": "1"}))
    assert other.workspace != TvmSourceBuilder(make_config(project, tmp_path)).workspace
    artifact = other.build(shas["first"])
    assert artifact.metrics["incremental"] is False
    assert artifact.metrics["ccache_hits"] >= 2 and artifact.metrics["ccache_hit_rate"] == 1.0


def test_a_second_repository_builds_in_the_shared_workspace(project, tmp_path):
    """One build configuration, one workspace: a fork of the repository (a commit only it has)
    built after the original is fetched from the fork, incrementally, not looked for in the
    original's mirror ("reference is not a tree")."""
    work, _, shas = project
    TvmSourceBuilder(make_config(project, tmp_path)).build(shas["first"])
    fork = git.Repo.clone_from(str(work), tmp_path / "fork")
    fork.git.execute(["git", "-C", fork.working_dir, "checkout", "--quiet", "-b", "feature", shas["first"]])
    (Path(fork.working_dir) / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON.format(doc=" The fork's."))
    _commit(fork, "only in the fork")
    forked = make_config(project, tmp_path)
    forked = forked.model_copy(update={"repo": RepoConfig(url=str(fork.working_dir))})
    builder = TvmSourceBuilder(forked)
    assert builder.workspace == TvmSourceBuilder(make_config(project, tmp_path)).workspace  # shared
    artifact = builder.build(builder.resolve("feature").sha)
    assert artifact.metrics["incremental"] is True and artifact.metrics["steps"] == 0, artifact.metrics
    assert "The fork's." in (artifact.path / "python" / "tvmshaped" / "__init__.py").read_text()


def test_config_values_with_spaces_reach_cmake_whole(project, tmp_path):
    """``CMAKE_CXX_FLAGS = "-DBONUS=100 -DUNUSED=1"`` is one value in config.cmake, not a list."""
    _, _, shas = project
    flags = {"USE_LLVM": "OFF", "CMAKE_CXX_FLAGS": "-DBONUS=100 -DUNUSED=1"}
    artifact = TvmSourceBuilder(make_config(project, tmp_path, cmake=flags)).build(shas["first"])
    assert run_python(artifact.path, "import tvmshaped; print(tvmshaped.version())").strip() == "143"


def test_runtime_only_builds_just_the_runtime(project, tmp_path):
    """For boards: only the runtime target, and only the listed submodule is checked out."""
    _, _, shas = project
    builder = TvmSourceBuilder(make_config(project, tmp_path, runtime_only=True, submodules=["3rdparty/tvm-ffi"]))
    artifact = builder.build(shas["first"])
    assert [p.name for p in (artifact.path / "lib").iterdir()] == ["libtvm_runtime.so"]
    assert "submodule update 3rdparty/tvm-ffi" not in artifact.log  # no failure message
    assert "tvm-ffi" in artifact.log


def test_a_repository_with_a_file_only_its_owner_reads_builds(project, tmp_path):
    """A partial clone keeps a 0600 ``.promisor`` file beside its packs: abwatch's mirror holds
    its own copies, so the build, cloning it as the sandbox's unprivileged user, reads them all."""
    work, _, shas = project
    clone = tmp_path / "partial"
    git.Repo.clone_from(str(work), clone).close()
    promisor = clone / ".git" / "objects" / "pack" / "pack-0000.promisor"
    promisor.write_text("")
    promisor.chmod(0o600)
    config = make_config(project, tmp_path / "cache", runtime_only=True, submodules=["3rdparty/tvm-ffi"])
    builder = TvmSourceBuilder(config.model_copy(update={"repo": RepoConfig(url=str(clone))}))
    artifact = builder.build(shas["first"])
    assert [p.name for p in (artifact.path / "lib").iterdir()] == ["libtvm_runtime.so"]
    mirrored = next((tmp_path / "cache" / "repos").glob("*.git/objects/pack/pack-0000.promisor"))
    assert mirrored.stat().st_ino != promisor.stat().st_ino  # a copy: its mode is abwatch's
    assert promisor.stat().st_mode & 0o777 == 0o600  # the user's repository is left as it was


def test_a_submodule_mirror_the_build_user_cannot_read_is_named(project, tmp_path):
    """The build clones submodules from their mirrors as the sandbox's user: a mirror with a
    file only its owner reads fails the build with what to do, not git's bare error."""
    _, mirrors, shas = project
    copy = tmp_path / "mirrors"
    git.Repo.clone_from(str(mirrors / "tvm-ffi"), copy / "tvm-ffi").close()
    promisor = copy / "tvm-ffi" / ".git" / "objects" / "pack" / "pack-0000.promisor"
    promisor.write_text("")
    promisor.chmod(0o600)
    builder = TvmSourceBuilder(make_config(project, tmp_path / "cache", runtime_only=True,
                                           submodules=["3rdparty/tvm-ffi"],
                                           submodule_rewrites={FAKE_REMOTE: f"{copy}/"}))
    with pytest.raises(BuildFailed, match=r"submodule update 3rdparty/tvm-ffi .*cannot read a file of the mirror"):
        builder.build(shas["first"])


def test_least_recently_used_artifacts_are_evicted(project, tmp_path):
    _, _, shas = project
    probe = TvmSourceBuilder(make_config(project, tmp_path / "probe"))
    probe.build(shas["first"])
    size = probe.cache.size_bytes()  # one artifact, its files counted once as the cache counts them
    # room for one artifact and a bit, not for two: the second shares its venv with the first
    # (stored once), but not its changed library
    limit_gb = (size + 4096) / 2**30
    builder = TvmSourceBuilder(make_config(project, tmp_path / "lru", cache_limit_gb=limit_gb))
    first = builder.build(shas["first"])
    compiler = builder.build(shas["compiler"])
    assert compiler.path.exists() and not first.path.exists()
    assert [key for _, key in builder.cache.entries()] == [compiler.key]
    assert builder.cache.size_bytes() <= limit_gb * 2**30


def test_build_failure_keeps_its_log(project, tmp_path):
    _, _, shas = project
    builder = TvmSourceBuilder(make_config(project, tmp_path))
    with pytest.raises(BuildFailed) as info:
        builder.build(shas["broken"])
    # the step, and the compiler's own words from hundreds of lines up the log
    assert str(info.value).startswith(f"compile of {shas['broken'][:12]} failed (status 1): ")
    assert "compiler.cc:1:1: error: expected unqualified-id" in str(info.value)
    assert "compiler.cc" in info.value.log
    assert builder.cache.get(builder.cache_key(shas["broken"])) is None


def _build(project, cache: str, sha: str, queue) -> None:
    artifact = TvmSourceBuilder(make_config(project, Path(cache))).build(sha)
    queue.put(artifact.cached)


def test_concurrent_builders_of_one_commit_build_once(project, tmp_path):
    _, _, shas = project
    _ = TvmSourceBuilder(make_config(project, tmp_path)).repo.repo  # clone the mirror up front
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(project, str(tmp_path), shas["first"], queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(queue.get(timeout=5) for _ in procs) == [False, True]


def test_compare_stores_a_failed_source_build(project, tmp_path, capsys, sqlite_url):
    work, mirrors, shas = project
    config = tmp_path / "src.toml"
    config.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(work))}
[build]
kind = "tvm-source"
cmake = {{USE_LLVM = "OFF"}}
python_packages = []
check_import = "tvmshaped"
submodule_rewrites = {{{json.dumps(FAKE_REMOTE)} = {json.dumps(str(mirrors) + "/")}}}
[[workloads]]
name = "ls"
command = ["ls", "lib"]
""")
    code = main(["compare", "--config", str(config), "--control", shas["first"], "--treatment", shas["broken"],
                 "--json", "--db", sqlite_url])
    payload = json.loads(capsys.readouterr().out)
    assert code == 3 and [b["status"] for b in payload["builds"]] == ["success", "build_failed"]
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        ok = session.scalars(select(Build).where(Build.status == BuildStatus.SUCCESS)).one()
        failed = session.scalars(select(Build).where(Build.status == BuildStatus.BUILD_FAILED)).one()
        assert ok.metrics["incremental"] is False and ok.metrics["steps"] >= 4
        assert "compiler.cc" in failed.log
    # the run's summary, the JSON's log tail and `abwatch show` name the step and the cause
    cause = "compiler.cc:1:1: error: expected unqualified-id"
    assert payload["builds"][1]["log_tail"].splitlines()[-1].startswith("abwatch: compile of")
    assert payload["builds"][1]["failure"].startswith("compile of") and cause in payload["builds"][1]["failure"]
    main(["show", str(payload["run_id"]), "--db", sqlite_url])
    assert f"treatment build 2 failed: compile of {shas['broken'][:12]} failed (status 1): " in capsys.readouterr().out


def test_unmerged_code_builds_apart_and_cannot_touch_what_trusted_builds_reuse(project, tmp_path):
    """A try or pull-request build (``for_untrusted``) runs in a workspace and compiler cache of
    its own: a commit whose CMakeLists writes into the trusted workspace and ccache (objects a
    later trusted build would link) is stopped by the sandbox, and its artifacts have keys of
    their own, so a trusted build never reuses one."""
    work, _, shas = project
    config = make_config(project, tmp_path)
    trusted = TvmSourceBuilder(config)
    first = trusted.build(shas["first"])
    targets = [trusted.workspace / "poison", trusted.ccache_dir / "poison"]
    assert trusted.workspace.is_dir() and trusted.ccache_dir.is_dir()
    repo = git.Repo(work)
    branch = repo.create_head(f"hostile-{tmp_path.name}", shas["first"])
    branch.checkout()
    try:
        writes = "".join(f'execute_process(COMMAND sh -c "echo poisoned > {t}")\n' for t in targets)
        (work / "CMakeLists.txt").write_text(CMAKELISTS + writes)
        hostile = _commit(repo, "try: write where trusted builds look")
    finally:
        repo.heads.main.checkout(force=True)
    apart = TvmSourceBuilder(config.model_copy(update={"build": config.build.for_untrusted()}))
    assert apart.workspace.parent.name == "tvm-source-untrusted" and apart.ccache_dir.name == "ccache-untrusted"
    built = apart.build(apart.resolve(hostile).sha)
    assert built.path.is_dir()  # it built, in its own workspace
    assert [t for t in targets if t.exists()] == []  # and wrote nothing where trusted builds look
    assert built.log.count("Read-only file system") >= 2, built.log[-2000:]  # it tried; the sandbox said no
    assert apart.build(shas["first"]).key != first.key  # the same commit, built apart, is another artifact
    assert apart.config.ccache_remote is None
