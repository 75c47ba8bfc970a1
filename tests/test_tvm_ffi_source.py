"""A tvm-ffi submodule pinned between release tags: its Python package is built from its source.

apache/tvm pins ``3rdparty/tvm-ffi`` by commit, mostly between tags; tvm-ffi's package takes its
version from git (setuptools-scm) and needs its own submodules (dlpack, libbacktrace). Here a
TVM-shaped project (real git, real CMake + Ninja, real pip) has such a submodule: a package
built by setuptools-scm with two submodules of its own, one in the mirror and one whose pinned
commit no mirror has (filled from ``submodule_fallbacks``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import git
import pytest

from abwatch.builders import BuildFailed, TvmSourceBuilder
from abwatch.builders.builder import failure_lines
from abwatch.builders.environment import build_python
from abwatch.builders.spec import ARTIFACT_INFO
from abwatch.service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig

REMOTE = "https://example.invalid/"
MISSING = "1" * 40  # a pinned commit no mirror has

CMAKELISTS = """cmake_minimum_required(VERSION 3.18)
project(tvmshaped CXX)
add_library(tvm_runtime SHARED src/runtime.cc)
"""
# the package checks at build time that both of its own submodules are there, as tvm-ffi's CMake does
SETUP = """from pathlib import Path
from setuptools import setup
for need in ("3rdparty/dlpack/include/dlpack/dlpack.h", "3rdparty/libbacktrace/backtrace.h"):
    if not Path(need).exists():
        raise SystemExit(f"error: {need}: No such file or directory")
Path("python/tvm_ffi/dlpack.h.txt").write_text(Path("3rdparty/dlpack/include/dlpack/dlpack.h").read_text())
setup(package_data={"tvm_ffi": ["dlpack.h.txt"]})
"""
PYPROJECT = """[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"
[project]
name = "apache-tvm-ffi"
dynamic = ["version"]
[tool.setuptools.package-dir]
"" = "python"
[tool.setuptools_scm]
"""


def _repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "abwatch test")
        cfg.set_value("user", "email", "test@abwatch.invalid")
    return repo


def _commit(repo: git.Repo, message: str, *paths: str) -> str:
    repo.git.add("--", *paths)
    repo.git.commit("--quiet", "-m", message)
    return repo.head.commit.hexsha


def _gitlinks(repo: git.Repo, links: dict[str, tuple[str, str]]) -> None:
    """Submodules ``path -> (url, pinned sha)`` as gitlinks (no clone needed)."""
    work = Path(repo.working_dir)
    (work / ".gitmodules").write_text("".join(f'[submodule "{path}"]\n\tpath = {path}\n\turl = {url}\n'
                                              for path, (url, _) in links.items()))
    for path, (_, sha) in links.items():
        repo.git.update_index("--add", "--cacheinfo", f"160000,{sha},{path}")
    repo.git.add(".gitmodules")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(TVM-shaped repo, mirrors dir, fallback dir, the tvm-ffi repo)."""
    root = tmp_path_factory.mktemp("ffi-between-tags")
    mirrors = root / "mirrors"
    backtrace = _repo(mirrors / "ianlancetaylor" / "libbacktrace")
    (Path(backtrace.working_dir) / "backtrace.h").write_text("/* libbacktrace */\n")
    backtrace_sha = _commit(backtrace, "libbacktrace", "backtrace.h")

    ffi = _repo(mirrors / "apache" / "tvm-ffi")
    work = Path(ffi.working_dir)
    (work / "python" / "tvm_ffi").mkdir(parents=True)
    (work / "python" / "tvm_ffi" / "__init__.py").write_text('"""tvm-ffi, shaped."""\n')
    (work / "pyproject.toml").write_text(PYPROJECT)
    (work / "setup.py").write_text(SETUP)
    _gitlinks(ffi, {"3rdparty/dlpack": (f"{REMOTE}dmlc/dlpack", MISSING),
                    "3rdparty/libbacktrace": (f"{REMOTE}ianlancetaylor/libbacktrace", backtrace_sha)})
    _commit(ffi, "tvm-ffi 0.1.0", "python", "pyproject.toml", "setup.py")
    ffi.create_tag("v0.1.0")
    for n in (1, 2):  # two commits past the tag: the pin sits between tags
        (work / "python" / "tvm_ffi" / "__init__.py").write_text(f'"""tvm-ffi, shaped ({n})."""\n')
        ffi_sha = _commit(ffi, f"change {n}", "python")
    dlpack = _repo(mirrors / "dmlc" / "dlpack")  # lacks the first pinned commit, has the later one
    (Path(dlpack.working_dir) / "include" / "dlpack").mkdir(parents=True)
    (Path(dlpack.working_dir) / "include" / "dlpack" / "dlpack.h").write_text("#define DLPACK_MIRRORED 1\n")
    dlpack_sha = _commit(dlpack, "dlpack", "include")

    fallback = root / "dlpack-headers"
    (fallback / "include" / "dlpack").mkdir(parents=True)
    (fallback / "include" / "dlpack" / "dlpack.h").write_text("#define DLPACK_MAJOR_VERSION 1\n")

    tvm = _repo(root / "tvm")
    twork = Path(tvm.working_dir)
    (twork / "src").mkdir()
    (twork / "src" / "runtime.cc").write_text('extern "C" int runtime_magic() { return 42; }\n')
    (twork / "CMakeLists.txt").write_text(CMAKELISTS)
    _gitlinks(tvm, {"3rdparty/tvm-ffi": (f"{REMOTE}apache/tvm-ffi", ffi_sha)})
    _commit(tvm, "TVM with tvm-ffi between tags", "src", "CMakeLists.txt")
    # a later tvm-ffi pins a dlpack commit the mirror has, and a later TVM pins that tvm-ffi
    _gitlinks(ffi, {"3rdparty/dlpack": (f"{REMOTE}dmlc/dlpack", dlpack_sha),
                    "3rdparty/libbacktrace": (f"{REMOTE}ianlancetaylor/libbacktrace", backtrace_sha)})
    later_ffi = _commit(ffi, "pin a mirrored dlpack", ".gitmodules")
    _gitlinks(tvm, {"3rdparty/tvm-ffi": (f"{REMOTE}apache/tvm-ffi", later_ffi)})
    _commit(tvm, "bump tvm-ffi", ".gitmodules")
    return twork, mirrors, fallback, ffi


def _builder(project, cache: Path, **build) -> TvmSourceBuilder:
    work, mirrors, fallback, _ = project
    options = {"cmake": {"USE_LLVM": "OFF"}, "python_packages": ["apache-tvm-ffi=={ffi_version}"],
               "check_import": "", "libraries": ["*.so"], "submodules": ["3rdparty/tvm-ffi"],
               "submodule_rewrites": {REMOTE: f"{mirrors}/"},
               "submodule_fallbacks": {"3rdparty/tvm-ffi/3rdparty/dlpack": fallback}, **build}
    return TvmSourceBuilder(Config(repo=RepoConfig(url=str(work)), cache_dir=cache,
                                   build=TvmSourceBuildConfig(**options),
                                   workloads=[CommandWorkloadConfig(name="w", command=["true"])]))


def _python(artifact: Path, code: str) -> str:
    return subprocess.run([str(build_python(artifact)), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_package_between_tags_installs_with_its_version_and_nested_submodules(project, tmp_path):
    _, _, fallback, ffi = project
    builder = _builder(project, tmp_path)
    artifact = builder.build(builder.resolve("main~1").sha)
    pinned = ffi.commit("HEAD~1")

    # setuptools-scm's own rule on the submodule's history: next patch release, dev<distance>,
    # +g<the pinned commit, abbreviated>
    tag, distance, _ = ffi.git.describe("--tags", "--long", pinned.hexsha).rsplit("-", 2)
    major, minor, patch = tag.lstrip("v").split(".")
    version = _python(artifact.path, "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))")
    assert builder.portable(artifact.path)  # a package built from a local source tree is installed, not linked
    public, _, local = version.partition("+g")
    assert public == f"{major}.{minor}.{int(patch) + 1}.dev{distance}"
    assert len(local) >= 7 and pinned.hexsha.startswith(local)
    # the nested submodule missing from its mirror came from the fallback; the other from its mirror
    packaged = _python(artifact.path, "import importlib.resources as r; "
                                      "print(r.files('tvm_ffi').joinpath('dlpack.h.txt').read_text())")
    assert packaged == (fallback / "include" / "dlpack" / "dlpack.h").read_text().strip()
    assert "3rdparty/tvm-ffi/3rdparty/dlpack: its pinned commit could not be checked out" in artifact.log
    assert "v0.1.0-2-g" in json.loads((artifact.path / ARTIFACT_INFO).read_text())["tvm_ffi_submodule"]
    # the worktree the package was built from is gone; the venv stays for the next build
    assert not list(tmp_path.glob("tvm-source/tvm-ffi-src-*"))

    # the next commit's tvm-ffi pins a dlpack the mirror has: the fallback's files make way for it
    later = builder.build(builder.resolve("main").sha)
    assert _python(later.path, "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))") == \
        f"{major}.{minor}.{int(patch) + 1}.dev{int(distance) + 1}+g{ffi.head.commit.hexsha[:len(local)]}"
    assert _python(later.path, "import importlib.resources as r; "
                               "print(r.files('tvm_ffi').joinpath('dlpack.h.txt').read_text())") == "#define DLPACK_MIRRORED 1"


def test_a_missing_pin_without_fallback_names_the_submodule_and_the_key(project, tmp_path):
    builder = _builder(project, tmp_path, submodule_fallbacks={})
    with pytest.raises(BuildFailed) as failed:
        builder.build(builder.resolve("main~1").sha)
    message = str(failed.value)
    assert message.startswith("submodule update 3rdparty/tvm-ffi/3rdparty/dlpack failed (status")
    assert MISSING in message  # git's own words: the commit it could not fetch
    assert 'submodule_fallbacks = {"3rdparty/tvm-ffi/3rdparty/dlpack"' in message


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_failed_package_build_names_its_step_and_the_lines_that_say_why(project, tmp_path):
    empty = tmp_path / "no-headers"
    empty.mkdir()
    builder = _builder(project, tmp_path / "cache", submodule_fallbacks={"3rdparty/tvm-ffi/3rdparty/dlpack": empty})
    with pytest.raises(BuildFailed) as failed:
        builder.build(builder.resolve("main~1").sha)
    message = str(failed.value)
    assert message.startswith("tvm-ffi package (v0.1.0-2-g")
    assert "3rdparty/dlpack/include/dlpack/dlpack.h: No such file or directory" in message


def test_failure_lines_skip_pip_frames_and_keep_cmake_messages():
    output = "\n".join([
        "-- Configuring incomplete", "CMake Error at cmake/Utils/AddLibbacktrace.cmake:10 (ExternalProject_Add):",
        "  No download info given for 'project_libbacktrace' and its source directory:", "  ok",
        "error: subprocess-exited-with-error", "× Building wheel for apache-tvm-ffi did not run successfully.",
        "note: This error originates from a subprocess, and is likely not a problem with pip.",
        "ERROR: Failed to build installable wheels for some pyproject.toml based projects (apache-tvm-ffi)",
    ])
    assert failure_lines(output) == [
        "CMake Error at cmake/Utils/AddLibbacktrace.cmake:10 (ExternalProject_Add):",
        "No download info given for 'project_libbacktrace' and its source directory:"]
    assert failure_lines("all went\nwrong here") == ["all went", "wrong here"]
