"""The builders by kind (:data:`BUILDERS`), as the config's ``[build] kind`` names them."""

from __future__ import annotations

from abwatch.builders.artifact_store import ArtifactStore
from abwatch.builders.base import Builder
from abwatch.builders.command import CommandBuilder
from abwatch.builders.spec import BuildSettings
from abwatch.builders.tvm_source import TvmSourceBuilder
from abwatch.builders.tvm_wheel import TvmWheelBuilder

BUILDERS: dict[str, type[Builder]] = {
    CommandBuilder.kind: CommandBuilder,
    TvmWheelBuilder.kind: TvmWheelBuilder,
    TvmSourceBuilder.kind: TvmSourceBuilder,
}


def make_builder(config: BuildSettings) -> Builder:
    """The builder the config's ``build.kind`` names (``config``: the whole ``Config`` will do),
    with the shared artifact store of ``[artifacts]`` where its artifacts can move between hosts
    and the code is trusted (an untrusted build, ``for_untrusted``, never reads or writes it)."""
    builder = BUILDERS[config.build.kind](config)
    artifacts = getattr(config, "artifacts", None)  # settings other than a Config may have none
    if artifacts is not None and builder.shareable and not builder.untrusted:  # try and pull-request builds: none
        builder.store = ArtifactStore.from_config(artifacts)
    return builder
