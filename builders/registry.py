"""The builders by kind (:data:`BUILDERS`), as the config's ``[build] kind`` names them.

A kind's name and config model are registered in :data:`abwatch.builders.spec.BUILD_KINDS`
(what the config validates by, without loading the builders); the model names its builder
class (``builder``, "module:Class"), loaded here under the same name: a new builder is its
module and its model's line in BUILD_KINDS.
"""

from __future__ import annotations

import pkgutil

from abwatch.builders.artifact_store import ArtifactStore
from abwatch.builders.builder import Builder
from abwatch.builders.spec import BUILD_KINDS, BuildSettings
from abwatch.core.plugins import Registry

BUILDERS: Registry[type[Builder]] = Registry(
    "builder", ((name, pkgutil.resolve_name(model.builder)) for name, model in BUILD_KINDS.items()), of=BUILD_KINDS)


def make_builder(config: BuildSettings) -> Builder:
    """The builder the config's ``build.kind`` names (``config``: the whole ``Config`` will do),
    with the shared artifact store of ``[artifacts]`` where its artifacts can move between hosts
    and the code is trusted (an untrusted build, ``for_untrusted``, never reads or writes it)."""
    builder = BUILDERS[config.build.kind](config)
    artifacts = getattr(config, "artifacts", None)  # settings other than a Config may have none
    if artifacts is not None and builder.shareable and not builder.untrusted:  # try and pull-request builds: none
        builder.store = ArtifactStore.from_config(artifacts)
    return builder
