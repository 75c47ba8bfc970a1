"""TVM's ``3rdparty/tvm-ffi`` submodule: its own submodules, and its Python package.

apache/tvm pins tvm-ffi by commit, and most pins sit between release tags (21 of the 27
pins in apache/tvm's first-parent history up to 2026-08). A build then needs the
``apache-tvm-ffi`` Python package made from the submodule's own source, which takes three
things the plain checkout lacks:

* **its version**: tvm-ffi's package takes it from git through setuptools-scm, so the
  package is built from a *git worktree* of the submodule at its exact commit (with its
  tags), never from a copy without ``.git``: setuptools-scm then computes exactly what
  upstream's build would (``v0.1.11-13-g98d0029d`` -> ``0.1.12.dev13+g98d0029dd``);
* **its own submodules** (``3rdparty/dlpack``, ``3rdparty/libbacktrace``), checked out
  recursively from the same mirrors (``submodule_rewrites``); a nested submodule whose pinned
  commit is missing from the mirror is filled from a directory the config names
  (``submodule_fallbacks``), e.g. the dlpack headers an apache-tvm-ffi wheel ships;
* **the build settings**: the ``cmake`` entries of ``[build]`` reach the package's CMake too
  (scikit-build-core's ``cmake.define``), with ccache as the compiler launcher.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from abwatch.builders.builder import BuildFailed

FFI_PATH = "3rdparty/tvm-ffi"

# Runs one step of a build: (argv, what, cwd) -> output; raises BuildFailed naming ``what``.
Step = Callable[[list[str], str, Path | None], str]


@dataclass(frozen=True)
class FfiState:
    """Where the ``3rdparty/tvm-ffi`` submodule stands: its commit, ``git describe``, and the
    release it is (``None`` between tags, as apache/tvm often pins it)."""

    path: Path
    sha: str
    describe: str
    release: str | None


def _output(argv: list[str]) -> str:
    """A command's standard output, run here (tests and benchmarks; a builder passes its sandbox's)."""
    return subprocess.run(argv, capture_output=True, text=True).stdout


def ffi_state(src: Path, output: Callable[[list[str]], str] | None = None) -> FfiState | None:
    """The tvm-ffi submodule of the checkout ``src``, or ``None`` when it has none.

    ``output``: runs a git command line and returns its standard output (empty on failure);
    a builder passes one that runs it in the build's sandbox, as the user that owns the
    checkout (git refuses another user's repository, and abwatch never runs git in a
    directory code under test could write)."""
    ffi = src / FFI_PATH
    if not (ffi / ".git").exists():
        return None
    run = output or _output

    def git(*args: str) -> str:
        return run(["git", "-C", str(ffi), *args]).strip()

    sha, describe = git("rev-parse", "HEAD"), git("describe", "--tags") or "untagged"
    exact = git("describe", "--tags", "--exact-match")
    return FfiState(ffi, sha, describe, exact.lstrip("v") or None)


def submodule_paths(repo: Path) -> list[str]:
    """The submodule paths ``repo``'s ``.gitmodules`` declares, in file order."""
    if not (repo / ".gitmodules").exists():
        return []
    out = subprocess.run(["git", "config", "-f", str(repo / ".gitmodules"), "--get-regexp", r"\.path$"],
                         capture_output=True, text=True).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if " " in line]


def wanted(path: str, only: list[str] | None) -> bool:
    """Whether the submodule at ``path`` (from the top checkout) is checked out: all of them
    without a list; with one, each listed path, its parents and everything inside it."""
    if only is None:
        return True
    return any(path == p or path.startswith(p + "/") or p.startswith(path + "/") for p in only)


def update_submodules(step: Step, git: list[str], repo: Path, *, prefix: str = "", only: list[str] | None = None,
                      fallbacks: Mapping[str, Path] | None = None, log: list[str] | None = None) -> None:
    """Check out ``repo``'s submodules recursively, each from the repository that contains it.

    ``prefix`` is ``repo``'s path in the top checkout: ``only`` and ``fallbacks`` name
    submodules by their path from the top (``3rdparty/tvm-ffi/3rdparty/dlpack``). A submodule
    that cannot be checked out (its pinned commit is not in the mirror) is filled from its
    fallback directory when it has one; otherwise the build fails naming it and the key to set.
    """
    fallbacks = fallbacks or {}
    for rel in submodule_paths(repo):
        top = f"{prefix}{rel}"
        if not wanted(top, only):
            continue
        here = repo / rel
        if here.is_dir() and not (here / ".git").exists() and any(here.iterdir()):
            fill_from(None, here)  # an earlier fallback: git would not clone over it, if this pin is mirrored
        try:
            step(git + ["-C", str(repo), "submodule", "update", "--init", "--force", "--", rel],
                 f"submodule update {top}", None)
        except BuildFailed as exc:
            if "Permission denied" in str(exc):  # the build clones as the sandbox's user, not abwatch's
                raise BuildFailed(f"{exc}; the build's user cannot read a file of the mirror "
                                  "(submodule_rewrites): make the mirror readable to all (chmod -R a+rX)",
                                  "", 0.0) from None
            if top not in fallbacks:
                raise BuildFailed(f"{exc}; if its pinned commit is missing from the mirror, set "
                                  f"[build] submodule_fallbacks = {{\"{top}\" = \"<directory>\"}}", "", 0.0) from None
            fill_from(Path(fallbacks[top]), repo / rel)
            if log is not None:
                log.append(f"note: {top}: its pinned commit could not be checked out; filled from "
                           f"{fallbacks[top]} (submodule_fallbacks)\n")
            continue  # a fallback is plain files: nothing inside it to recurse into
        update_submodules(step, git, repo / rel, prefix=f"{top}/", only=only, fallbacks=fallbacks, log=log)


def fill_from(source: Path | None, target: Path) -> None:
    """Replace what ``target`` holds (a failed clone's ``.git`` file included) by ``source``'s
    files (``None``: leave it empty).

    Without a ``.git`` of its own the directory is an uninitialised submodule to git, so the
    parent's ``git status`` stays clean and setuptools-scm does not call the build dirty.
    """
    if source is not None and not source.is_dir():
        raise BuildFailed(f"submodule_fallbacks: {source} is not a directory", "", 0.0)
    # abwatch empties it as root, outside the sandbox: the checkout is the build's, and a link
    # there (to a host directory) must not have that directory emptied
    if os.path.realpath(target) != os.path.abspath(target):
        raise BuildFailed(f"{target} is or passes through a symbolic link: not filled from submodule_fallbacks",
                          "", 0.0)
    target.mkdir(parents=True, exist_ok=True)
    for entry in target.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if source is not None:
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


def ffi_worktree(step: Step, git: list[str], ffi: FfiState, target: Path, *,
                 fallbacks: Mapping[str, Path] | None = None, log: list[str] | None = None,
                 output: Callable[[list[str]], str] | None = None) -> Path:
    """A git worktree of the submodule at its commit in ``target``, its own submodules checked out.

    The worktree shares the submodule's repository (tags included), so setuptools-scm finds
    the version; the caller removes it with :func:`remove_worktree` once the package is built.
    """
    remove_worktree(ffi, target, output)
    step(git + ["-C", str(ffi.path), "worktree", "add", "--detach", "--force", str(target), ffi.sha],
         "tvm-ffi package (worktree)", None)
    update_submodules(step, git, target, prefix=f"{FFI_PATH}/", fallbacks=fallbacks, log=log)
    return target


def install_package(step: Step, git: list[str], ffi: FfiState, target: Path, pip: list[str], *,
                    cmake: Mapping[str, str], launcher: str | None,
                    fallbacks: Mapping[str, Path] | None = None, log: list[str] | None = None,
                    output: Callable[[list[str]], str] | None = None,
                    before_install: Callable[[Path], None] | None = None) -> None:
    """Build apache-tvm-ffi from a worktree of the submodule at ``target`` and install it with
    ``pip`` (an argv ending in ``install``), the build's CMake settings handed on; the
    worktree is removed afterwards, whatever happened. ``output``: as for :func:`ffi_state`;
    ``before_install``: called with the worktree before pip (a builder downloads what the
    package needs to be built there)."""
    ffi_worktree(step, git, ffi, target, fallbacks=fallbacks, log=log, output=output)
    try:
        if before_install is not None:
            before_install(target)
        step([*pip, *package_settings(cmake, launcher), str(target)], f"tvm-ffi package ({ffi.describe})", None)
    finally:
        remove_worktree(ffi, target, output)


def remove_worktree(ffi: FfiState, target: Path, output: Callable[[list[str]], str] | None = None) -> None:
    """Remove the worktree ``target`` (if any) and forget it in the submodule's repository
    (``output``: as for :func:`ffi_state`)."""
    shutil.rmtree(target, ignore_errors=True)
    (output or _output)(["git", "-C", str(ffi.path), "worktree", "prune"])


def package_settings(cmake: Mapping[str, str], launcher: str | None) -> list[str]:
    """pip ``--config-settings`` that hand the build's CMake entries (and ccache) to the
    package's scikit-build-core build: the settings that make an offline TVM build possible
    (``TVM_FFI_USE_LIBBACKTRACE``, ``CMAKE_CXX_FLAGS``, ...) reach this CMake too."""
    defines = dict(cmake)
    if launcher:
        defines.setdefault("CMAKE_C_COMPILER_LAUNCHER", launcher)
        defines.setdefault("CMAKE_CXX_COMPILER_LAUNCHER", launcher)
    return [f"--config-settings=cmake.define.{name}={value}" for name, value in sorted(defines.items())]
