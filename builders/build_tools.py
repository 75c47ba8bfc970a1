"""The tools a ``tvm-source`` build runs (CMake, Ninja, ccache), checked before it starts.

A clean TVM build compiles for most of an hour; a tool too old for what abwatch asks of it
must be refused in the first second, naming the version it needs and how to get it, never
found out when the compile is done (Debian 12's ccache 4.7 builds all ~600 steps, then
does not know ``--print-log-stats``). Each tool is probed for what abwatch asks of it:
CMake's version (its options), Ninja's presence, and ccache's per-build statistics log
asked of it for real.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from abwatch.core.errors import UsageError

# -S/-B (CMake 3.13), --build --parallel (3.12), CMAKE_BUILD_RPATH_USE_ORIGIN (3.14): what
# abwatch's own configure and build steps use; TVM's CMakeLists states its own minimum, which
# CMake reports at once in the configure step
CMAKE_MINIMUM = (3, 14)
# what ``ccache --print-log-stats`` (each build's own counts) needs; Debian 12 ships 4.7.5
CCACHE_LOG_STATS = "4.8"
HOW_TO_GET = ("pip install 'abwatch[source]' (CMake, Ninja and ccache from PyPI, into abwatch's own "
              "environment, where abwatch looks first)")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def tool(name: str) -> str | None:
    """A build tool from abwatch's own environment (pip's cmake, ninja, ccache) or the PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


@dataclass(frozen=True)
class BuildTools:
    """The tools a build runs, each checked (``ccache`` None: builds run without a compiler cache)."""

    cmake: str
    ninja: str
    ccache: str | None


def version_of(path: str) -> tuple[int, ...] | None:
    """The first ``X.Y[.Z]`` that ``path --version`` prints (None: it printed none, or did not run)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _VERSION.search(out)
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def _shown(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "of an unknown version"


def logs_build_stats(ccache: str) -> bool:
    """Whether ``ccache`` reads a statistics log (``--print-log-stats``): asked of it for real,
    on an empty log in a scratch cache directory, so the check needs no version table."""
    with tempfile.TemporaryDirectory(prefix="abwatch-ccache-probe-") as scratch:
        log = Path(scratch) / "stats.log"
        log.touch()
        env = {**os.environ, "CCACHE_DIR": scratch, "CCACHE_STATSLOG": str(log)}
        try:
            return subprocess.run([ccache, "--print-log-stats"], capture_output=True, env=env,
                                  timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


@functools.lru_cache(maxsize=8)
def _checked(cmake: str | None, ninja: str | None, ccache: str | None) -> BuildTools:
    problems = []
    if cmake is None:
        problems.append("cmake is not installed")
    elif (found := version_of(cmake)) is None or found < CMAKE_MINIMUM:
        problems.append(f"{cmake} is CMake {_shown(found)}; abwatch needs CMake "
                        f"{_shown(CMAKE_MINIMUM)} or newer")
    if ninja is None:
        problems.append("ninja is not installed")
    if ccache is not None and not logs_build_stats(ccache):
        problems.append(f"{ccache} is ccache {_shown(version_of(ccache))}, which has no --print-log-stats "
                        f"(each build's own hits and misses): abwatch needs ccache {CCACHE_LOG_STATS} or newer, "
                        "or none on the PATH")
    if problems:
        raise UsageError(f"tvm-source builds cannot start: {'; '.join(problems)}. Get them with {HOW_TO_GET}")
    assert cmake is not None and ninja is not None
    return BuildTools(cmake=cmake, ninja=ninja, ccache=ccache)


def check_build_tools() -> BuildTools:
    """The build tools, each fit for what abwatch asks of it; raises
    :class:`~abwatch.builders.spec.UsageError` naming every one that is missing or too old,
    the version needed and how to get it. Checked once per process for the same tools."""
    return _checked(tool("cmake"), tool("ninja"), tool("ccache"))
