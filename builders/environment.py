"""The environment a process needs to use one build: its Python first on ``PATH`` and the
variables its builder recorded (``PYTHONPATH``, ``TVM_LIBRARY_PATH``, ...).

TVM builders write ``abwatch-artifact.json`` into each artifact: ``python`` (the build's
interpreter, relative to the artifact or absolute), ``env_paths`` (variables whose values are
paths inside the artifact) and ``env`` (plain variables). The TVM harness worker and
``command`` workloads both start through :func:`build_environment`, so a workload command
``["python", "bench/attention.py"]`` measures that build and not whatever TVM the host has.
A ``command`` build records none of this: its workloads get nothing added.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from abwatch.builders.spec import ARTIFACT_INFO


class ArtifactInfoError(Exception):
    """An artifact's ``abwatch-artifact.json`` is unreadable or lacks ``python``."""


def artifact_info(artifact: Path) -> dict | None:
    """The artifact's recorded description, or ``None`` for an artifact without one."""
    path = artifact / ARTIFACT_INFO
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactInfoError(f"{path}: unreadable ({exc})") from None
    if not isinstance(info, dict) or not isinstance(info.get("python"), str):
        raise ArtifactInfoError(f"{path}: no 'python' entry")
    return info


def build_python(artifact: Path) -> Path | None:
    """The build's Python interpreter (``None`` for an artifact that records none)."""
    info = artifact_info(artifact)
    return None if info is None else artifact / info["python"]  # an absolute path stays absolute


def build_environment(artifact: Path) -> dict[str, str]:
    """Variables to add to a child's environment so that it runs with this build.

    The interpreter's directory goes first on ``PATH`` (a venv's ``bin/`` holds ``python``
    and ``python3``), ``VIRTUAL_ENV`` names that venv, ``env_paths`` become absolute paths in
    the artifact, and ``ABWATCH_ARTIFACT`` is the artifact itself.
    """
    info = artifact_info(artifact)
    if info is None:
        return {}
    python = artifact / info["python"]
    bindir = python.parent
    path = os.environ.get("PATH", os.defpath)
    env = {"PATH": f"{bindir}{os.pathsep}{path}" if path else str(bindir),
           "VIRTUAL_ENV": str(bindir.parent), "ABWATCH_ARTIFACT": str(artifact)}
    env.update({name: str(artifact / rel) for name, rel in info.get("env_paths", {}).items()})
    env.update(info.get("env", {}))
    return env


def missing_libraries(libraries: list[Path], timeout_s: float = 60.0) -> list[str]:
    """The shared libraries ``libraries`` link against that this host lacks (``ldd``'s ``not
    found``), each named once: e.g. the LLVM a TVM build links, installed on its build host only.
    Empty where ``ldd`` is not installed (nothing can be said)."""
    missing: list[str] = []
    for library in libraries:
        try:
            out = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=timeout_s).stdout
        except (OSError, subprocess.TimeoutExpired):
            return missing
        for line in out.splitlines():
            name, arrow, where = line.strip().partition("=>")
            if arrow and where.strip() == "not found" and name.strip() not in missing:
                missing.append(name.strip())
    return missing
