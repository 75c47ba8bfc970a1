"""What a build installs with pip, downloaded by abwatch before the build, which has no network.

Builds run sandboxed without the network (``[sandbox] build_network``), so the packages a
build's venv needs are fetched first by abwatch's own pip, outside the sandbox, as wheels
only (``--only-binary=:all:``: downloading runs no package's code), into a directory of the
cache shared by every build (``{cache_dir}/wheelhouse``); the build's pip then installs from
there alone (:func:`install_options`). A local package directory a requirement names is not
downloaded (the build makes it), but what its ``pyproject.toml`` says it needs to be built and
to run is, and what its build backend will ask for besides (scikit-build-core asks for CMake and
Ninja from the index when the host's are missing or older than the project wants).
"""

from __future__ import annotations

import os
import re
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from abwatch.builders.builder import BuildFailed
from abwatch.builders.nofollow import read_inside
from abwatch.builders.procs import cut_log, ending, run_process

LOG_LIMIT = 200_000
SETUPTOOLS_DEFAULT = ("setuptools>=40.8.0", "wheel")  # pip's build requirements where pyproject names none
# scikit-build-core's defaults for the CMake and Ninja it wants (its docs: cmake.version, ninja.version)
SKBUILD_DEFAULTS = {"cmake": ">=3.15", "ninja": ">=1.5"}
SPECIFIER = re.compile(r"^\s*(?:[<>=!~]=?\s*\d+(?:\.\d+)*\s*,?\s*)+$")
CMAKE_MINIMUM = re.compile(r"cmake_minimum_required\s*\(\s*VERSION\s+(\d+(?:\.\d+){0,2})", re.IGNORECASE)


def wheelhouse(cache_dir: Path) -> Path:
    """The directory of downloaded wheels every build of this cache installs from."""
    path = cache_dir / "wheelhouse"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)  # read by builds, as the sandbox's user
    return path


def local_needs(base: Path, directory: str) -> list[str]:
    """What the local package directory ``base/directory`` needs from an index: its build
    requirements and its static dependencies (``pyproject.toml``; setuptools' defaults
    without one)."""
    where = base / directory / "pyproject.toml"
    try:
        text = read_inside(base, f"{directory}/pyproject.toml" if directory not in ("", ".") else "pyproject.toml")
        if text is None:
            return list(SETUPTOOLS_DEFAULT)
        data = tomllib.loads(text)
    except OSError as exc:  # a link where a directory or the file should be (ELOOP, ENOTDIR)
        raise BuildFailed(f"{where}: cannot read it ({exc.strerror})", "", 0.0) from None
    except tomllib.TOMLDecodeError as exc:
        raise BuildFailed(f"{where}: not TOML ({exc})", "", 0.0) from None
    build = data.get("build-system", {}).get("requires", list(SETUPTOOLS_DEFAULT))
    runtime = data.get("project", {}).get("dependencies", [])
    needs = [str(r) for r in (*build, *runtime) if isinstance(r, str)]
    if data.get("build-system", {}).get("build-backend") == "scikit_build_core.build":
        needs += _skbuild_tools(base, directory, data.get("tool", {}).get("scikit-build", {}))
    return needs


def _skbuild_tools(base: Path, directory: str, settings: object) -> list[str]:
    """The CMake and Ninja scikit-build-core asks pip for while building (its backend's dynamic
    requirements, which no ``pyproject.toml`` lists): whichever the host has, the offline
    build finds them in the wheelhouse. ``cmake.version = "CMakeLists.txt"`` is the project's
    ``cmake_minimum_required``; only a plain version specifier is taken from the file."""
    settings = settings if isinstance(settings, dict) else {}
    wanted = {}
    for tool, default in SKBUILD_DEFAULTS.items():
        table = settings.get(tool, {})
        spec = table.get("version") if isinstance(table, dict) else None
        if spec == "CMakeLists.txt" and tool == "cmake":
            lists = read_inside(base, f"{directory}/CMakeLists.txt" if directory not in ("", ".") else "CMakeLists.txt")
            found = CMAKE_MINIMUM.search(lists or "")
            spec = f">={found.group(1)}" if found else None
        wanted[tool] = spec if isinstance(spec, str) and SPECIFIER.match(spec) else default
    return [f"{tool}{spec.replace(' ', '')}" for tool, spec in wanted.items()]


def download(requirements: Iterable[str], into: Path, env: Mapping[str, str], timeout_s: float,
             what: str) -> str:
    """Download ``requirements`` (and what they depend on) as wheels into ``into``, with
    abwatch's own pip and the network; the log. A failure raises :class:`BuildFailed`
    naming ``what``."""
    wanted = sorted({str(r) for r in requirements if r})
    if not wanted:
        return ""
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
            "--only-binary=:all:", "--dest", str(into), *wanted]
    start = time.monotonic()
    try:
        proc = run_process(argv, cwd=None, env=dict(env), timeout_s=timeout_s, merge_stderr=True, sandbox=None)
    except OSError as exc:
        raise BuildFailed(f"{what}: cannot run pip download: {exc.strerror}", "", 0.0) from None
    log = f"$ {' '.join(argv)}\n{cut_log(proc.stdout, LOG_LIMIT, proc.cut)}"
    if proc.timed_out:
        raise BuildFailed(f"{what}: downloading {', '.join(wanted)} timed out", log, time.monotonic() - start)
    if proc.returncode != 0:
        lines = [line for line in proc.stdout.splitlines() if "ERROR" in line][-3:]
        raise BuildFailed(f"{what}: downloading {', '.join(wanted)} failed ({ending(proc)}): "
                          f"{' | '.join(lines) or 'see the log'} (only wheels are downloaded: builds have no network)",
                          log, time.monotonic() - start)
    for wheel in into.iterdir():
        os.chmod(wheel, 0o644)
    return log


def install_options(into: Path) -> list[str]:
    """pip options that install from the downloaded wheels alone (build isolation included)."""
    return ["--no-index", "--find-links", str(into)]
