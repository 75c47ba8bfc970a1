"""Builders turn a commit into an artifact; registered by kind in :data:`BUILDERS`.

Importing this package must stay cheap: every module under it (``builders.spec``, the config
models) is imported through it, the command line's parser among them, while the builders
themselves need GitPython and the build tools. The API
below is therefore resolved on first use (PEP 562), as ``service.stats`` does; type checkers
see the plain imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "builder": ("Artifact", "Builder", "BuildFailed", "InfraFailure"),
    "spec": ("BuildSettings",),
    "command": ("CommandBuilder",),
    "tvm_source": ("TvmSourceBuilder",),
    "tvm_wheel": ("TvmWheelBuilder",),
    "registry": ("BUILDERS", "make_builder"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = ["Artifact", "Builder", "BuildFailed", "BUILDERS", "BuildSettings", "InfraFailure", "CommandBuilder",
           "TvmSourceBuilder", "TvmWheelBuilder", "make_builder"]

if TYPE_CHECKING:
    from abwatch.builders.builder import Artifact, Builder, BuildFailed, InfraFailure
    from abwatch.builders.command import CommandBuilder
    from abwatch.builders.registry import BUILDERS, make_builder
    from abwatch.builders.spec import BuildSettings
    from abwatch.builders.tvm_source import TvmSourceBuilder
    from abwatch.builders.tvm_wheel import TvmWheelBuilder


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
