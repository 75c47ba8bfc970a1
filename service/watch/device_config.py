"""The devices a watch's jobs run on, and a config pinned to one of them.

Below :mod:`.poll` (the watch's jobs) and :mod:`.tryjob` (a person's), which both queue jobs
per device and run each on its device's config.
"""

from __future__ import annotations

from abwatch.runners import make_runner
from abwatch.service.config import Config


def device_names(config: Config) -> list[str]:
    """The devices a watch queues jobs for: ``[watch] devices``, else the runner's own
    (:meth:`~abwatch.runners.runner.Runner.device_name`, the name its comparisons store)."""
    if config.watch.devices:
        return list(config.watch.devices)
    return [make_runner(config).device_name()]


def for_device(config: Config, device: str) -> Config:
    """``config`` with its runner pinned to ``device`` (the name the runs are stored under)."""
    return config.model_copy(update={"runner": config.runner.model_copy(update={"device": device})})
