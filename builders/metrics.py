"""The names of what a workload can be measured by: the one ``Metric`` definition.

At the bottom of the layers so that the config models (``builders.spec``: a workload's
``measure``), the runners and the service (a regression's ``metric`` column, the metric
registry ``service.compare.metrics.METRICS``) all name metrics by the same enum. What each
metric means, how it is measured and judged is the registry's; this module only names them.
"""

from __future__ import annotations

import enum


class Metric(str, enum.Enum):
    """What a verdict measured. A regression says which metric opened it, and is verified and
    bisected on that one."""

    TIME = "time"  # wall time of the timed region (the samples)
    INSTRUCTIONS = "instructions"  # instructions a process retired (perf or Valgrind)
    CPU_TIME = "cpu_time"  # user + system CPU time of each measured process (or timed region)
    MAX_RSS = "max_rss"  # peak resident memory of each measured process (or timed region)


# Metrics judged from the timed processes themselves (no processes of their own): a workload
# measured by one of them is timed too.
FROM_TIMED_PROCESSES = (Metric.CPU_TIME, Metric.MAX_RSS)
