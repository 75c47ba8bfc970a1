"""The tvm-source builder's tvm-ffi handling, on the TVM-shaped CMake project of
``test_tvm_source``: a submodule between release tags gets its Python package built from its
own source, each build is checked by importing it with its Python, and a Python package that
does not match the compiled library fails the build naming both versions. ``build.keep``
copies repository paths into the artifact. Real git, CMake, Ninja, pip (a local project).
"""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from abwatch.builders import BuildFailed, TvmSourceBuilder
from tests.test_tvm_source import CMAKELISTS, COMPILER, FAKE_REMOTE, RUNTIME, _commit, run_python
from abwatch.service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig

pytestmark = pytest.mark.slow  # real builds and pip installs

# The package checks that its Python side matches the library it loads, as tvm_ffi's Cython
# core does in effect: a mismatch is an import error.
PYTHON = '''import ctypes, os
import tvm_ffi
_dir = os.environ["TVM_LIBRARY_PATH"]
ctypes.CDLL(os.path.join(_dir, "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
_lib = ctypes.CDLL(os.path.join(_dir, "libtvm.so"))
if _lib.compiler_version() - 1 != tvm_ffi.MAGIC:
    raise ImportError(f"tvm_ffi {tvm_ffi.MAGIC} does not match the library's {_lib.compiler_version() - 1}")
'''
FFI_PYPROJECT = '''[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "apache-tvm-ffi"
version = "{version}"
[tool.setuptools]
packages = ["tvm_ffi"]
'''


def _ffi_release(work: Path, magic: int, version: str) -> None:
    (work / "include").mkdir(exist_ok=True)
    (work / "include" / "tvmffi_magic.h").write_text(f"#define FFI_MAGIC {magic}\n")
    (work / "tvm_ffi").mkdir(exist_ok=True)
    (work / "tvm_ffi" / "__init__.py").write_text(f"MAGIC = {magic}\n")
    (work / "pyproject.toml").write_text(FFI_PYPROJECT.format(version=version))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A TVM-shaped project whose tvm-ffi submodule sits one commit past its tag v0.1.7, and
    a copy of the tagged release (as a release on an index would be)."""
    root = tmp_path_factory.mktemp("ffi-check")
    ffi = git.Repo.init(root / "mirrors" / "tvm-ffi", initial_branch="main")
    ffi_work = Path(ffi.working_dir)
    _ffi_release(ffi_work, 42, "0.1.7")
    _commit(ffi, "release")
    ffi.create_tag("v0.1.7")
    released = root / "release-0.1.7"
    ffi.git.execute(["git", "worktree", "add", "--quiet", "--detach", str(released), "v0.1.7"])
    _ffi_release(ffi_work, 43, "0.1.8.dev1")  # the library and its Python change together
    ffi_sha = _commit(ffi, "past the tag")

    repo = git.Repo.init(root / "tvm", initial_branch="main")
    work = Path(repo.working_dir)
    (work / "src").mkdir()
    (work / "python" / "tvmshaped").mkdir(parents=True)
    (work / "bench").mkdir()
    (work / "CMakeLists.txt").write_text(CMAKELISTS)
    (work / "src" / "runtime.cc").write_text(RUNTIME)
    (work / "src" / "compiler.cc").write_text(COMPILER.format(v=1))
    (work / "python" / "tvmshaped" / "__init__.py").write_text(PYTHON)
    (work / "bench" / "attention.py").write_text("print('kept')\n")
    (work / ".gitmodules").write_text(f'[submodule "3rdparty/tvm-ffi"]\n\tpath = 3rdparty/tvm-ffi\n'
                                      f"\turl = {FAKE_REMOTE}tvm-ffi\n")
    repo.git.update_index("--add", "--cacheinfo", f"160000,{ffi_sha},3rdparty/tvm-ffi")
    sha = _commit(repo, "first")
    return work, root / "mirrors", sha, released


def _builder(project, cache: Path, packages: list[str], **build) -> TvmSourceBuilder:
    work, mirrors, _, _ = project
    build.setdefault("check_import", "tvmshaped")
    spec = TvmSourceBuildConfig(cmake={"USE_LLVM": "OFF"}, python_packages=packages,
                                submodule_rewrites={FAKE_REMOTE: f"{mirrors}/"}, **build)
    return TvmSourceBuilder(Config(repo=RepoConfig(url=str(work)), cache_dir=cache, build=spec,
                                   workloads=[CommandWorkloadConfig(name="w", command=["true"])]))


def test_between_tags_the_ffi_package_is_built_from_the_submodule(project, tmp_path):
    _, _, sha, _ = project
    builder = _builder(project, tmp_path, ["apache-tvm-ffi=={ffi_version}"], keep=["bench"])
    artifact = builder.build(sha)
    assert "v0.1.7-1-g" in artifact.log and "built from the submodule's source" in artifact.log
    assert "check passed" in artifact.log
    code = "import importlib.metadata as m, tvmshaped, tvm_ffi; print(m.version('apache-tvm-ffi'), tvm_ffi.MAGIC)"
    assert run_python(artifact.path, code).split() == ["0.1.8.dev1", "43"]
    assert (artifact.path / "src" / "bench" / "attention.py").read_text() == "print('kept')\n"


def test_a_release_that_does_not_match_the_library_fails_the_build_naming_both(project, tmp_path):
    _, _, sha, released = project
    builder = _builder(project, tmp_path, [str(released)])  # the tag's release, not the pinned commit
    with pytest.raises(BuildFailed) as failure:
        builder.build(sha)
    message = str(failure.value)
    assert "import tvmshaped failed" in message and "tvm_ffi 42 does not match the library's 43" in message
    assert "submodule v0.1.7-1-g" in message and "apache-tvm-ffi 0.1.7" in message
    assert builder.cache.get(builder.cache_key(sha)) is None  # nothing half-checked is kept


def test_a_kept_path_missing_from_the_commit_fails_the_build(project, tmp_path):
    _, _, sha, _ = project
    with pytest.raises(BuildFailed, match="build.keep: nothing_here is not in this commit"):
        _builder(project, tmp_path, [], keep=["nothing_here"], check_import="").build(sha)
