"""Builders turn a commit into an artifact; registered by kind in :data:`BUILDERS`."""

from builders.base import Artifact, Builder, BuildFailed
from builders.command import CommandBuilder

BUILDERS: dict[str, type[Builder]] = {
    CommandBuilder.kind: CommandBuilder,
}

__all__ = ["Artifact", "Builder", "BuildFailed", "BUILDERS", "CommandBuilder"]
