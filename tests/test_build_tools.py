"""A tvm-source build's tools are checked before anything is fetched or built: Debian 12's
ccache 4.7 (the real one, from apt) is refused at once, naming what it lacks, the version
needed and how to get it, instead of being found out after an hour's compile."""

from __future__ import annotations

from pathlib import Path

import pytest

from abwatch.builders import TvmSourceBuilder, build_tools
from abwatch.core.errors import UsageError
from tests.test_tvm_source import make_config, project  # noqa: F401  (the fixture)

DEBIAN_CCACHE = "/usr/bin/ccache"


def debian_ccache() -> str:
    if not Path(DEBIAN_CCACHE).exists():  # scripts/test.sh installs it (apt-get install ccache)
        pytest.fail(f"{DEBIAN_CCACHE} is missing: apt-get install ccache (Debian's, older than abwatch's own)")
    return DEBIAN_CCACHE


def test_abwatchs_own_tools_pass_and_are_the_ones_used():
    tools = build_tools.check_build_tools()
    assert tools.cmake == build_tools.tool("cmake") and tools.ninja == build_tools.tool("ninja")
    assert tools.ccache is not None and build_tools.logs_build_stats(tools.ccache)


def test_a_ccache_without_build_statistics_is_refused_with_the_version_needed():
    old = debian_ccache()
    version = build_tools.version_of(old)
    if version is None or version >= (4, 8):
        pytest.fail(f"{old} is ccache {version}: the test needs Debian 12's 4.7")
    assert not build_tools.logs_build_stats(old)
    with pytest.raises(UsageError) as refused:
        build_tools._checked(build_tools.tool("cmake"), build_tools.tool("ninja"), old)
    message = str(refused.value)
    assert f"{old} is ccache {'.'.join(map(str, version))}" in message
    assert "--print-log-stats" in message and "ccache 4.8 or newer" in message
    assert "pip install 'abwatch[source]'" in message


def test_a_cmake_too_old_and_a_missing_ninja_are_named_together(tmp_path):
    # an old CMake cannot be installed beside the new one here: a stand-in that answers as 3.10 does
    cmake = tmp_path / "cmake"
    cmake.write_text("#!/bin/sh\necho 'cmake version 3.10.2'\n")
    cmake.chmod(0o755)
    with pytest.raises(UsageError) as refused:
        build_tools._checked(str(cmake), None, None)
    message = str(refused.value)
    assert f"{cmake} is CMake 3.10.2; abwatch needs CMake 3.14 or newer" in message
    assert "ninja is not installed" in message


def test_the_refusal_comes_before_the_repository_is_fetched(project, tmp_path, monkeypatch):  # noqa: F811
    old = debian_ccache()
    own = build_tools.tool
    monkeypatch.setattr(build_tools, "tool", lambda name: old if name == "ccache" else own(name))
    builder = TvmSourceBuilder(make_config(project, tmp_path / "cache"))
    _, _, shas = project
    with pytest.raises(UsageError, match="has no --print-log-stats"):
        builder.resolve(shas["first"])
    # nothing was fetched, cloned or built for a build that could not have finished
    assert not builder.repo.path.exists() and not builder.workspace.exists()
