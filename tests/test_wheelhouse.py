"""What abwatch downloads before an offline build of a local package: its pyproject's needs and
what its build backend asks for while building (builders/wheelhouse.py)."""

from __future__ import annotations

from abwatch.builders.wheelhouse import local_needs

SKBUILD = """[build-system]
requires = ["scikit-build-core>=0.10.0", "cython>=3.2.8"]
build-backend = "scikit_build_core.build"
[project]
name = "pkg"
dependencies = ["numpy"]
[tool.scikit-build]
ninja.version = ">=1.11"
cmake.version = "{cmake}"
"""


def test_a_scikit_build_package_gets_the_cmake_and_ninja_its_backend_asks_for(tmp_path):
    # as tvm-ffi's: CMake's version from its CMakeLists.txt, Ninja's from pyproject
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text(SKBUILD.format(cmake="CMakeLists.txt"))
    (tmp_path / "pkg" / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.26)\nproject(p)\n")
    assert local_needs(tmp_path, "pkg") == ["scikit-build-core>=0.10.0", "cython>=3.2.8", "numpy",
                                            "cmake>=3.26", "ninja>=1.11"]
    # a specifier in pyproject is taken; anything else falls back to scikit-build-core's defaults
    (tmp_path / "pkg" / "pyproject.toml").write_text(SKBUILD.format(cmake=">=3.18, <4"))
    assert local_needs(tmp_path, "pkg")[-2:] == ["cmake>=3.18,<4", "ninja>=1.11"]
    (tmp_path / "pkg" / "pyproject.toml").write_text(SKBUILD.format(cmake="cmake; rm -rf /"))
    assert local_needs(tmp_path, "pkg")[-2] == "cmake>=3.15"


def test_other_backends_get_what_their_pyproject_says(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["hatchling"]\n'
                                             'build-backend = "hatchling.build"\n')
    assert local_needs(tmp_path, ".") == ["hatchling"]
    (tmp_path / "pyproject.toml").unlink()
    assert local_needs(tmp_path, ".") == ["setuptools>=40.8.0", "wheel"]
