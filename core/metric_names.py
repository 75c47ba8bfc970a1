"""The names of what a workload can be measured by: the one ``Metric`` definition.

In core, below every layer, so that the config models (``builders.workload_spec``: a
workload's ``measure``), the runners and the service (a regression's ``metric`` column, the
metric registry ``service.compare.metrics.METRICS``) all name metrics by the same enum. What
each metric means, how it is measured and judged is the registry's; this module only names them
(:data:`METRIC_NAMES`, the registry of names the metric classes' registry is ``of``).
"""

from __future__ import annotations

import enum

from abwatch.core.plugins import Registry


class Metric(str, enum.Enum):
    """What a verdict measured. A regression says which metric opened it, and is verified and
    bisected on that one."""

    TIME = "time"  # wall time of the timed region (the samples)
    INSTRUCTIONS = "instructions"  # instructions a process retired (perf or Valgrind)
    CPU_TIME = "cpu_time"  # user + system CPU time of each measured process (or timed region)
    MAX_RSS = "max_rss"  # peak resident memory of each measured process (or timed region)
    CODE_SIZE = "code_size"  # the size of what the compile produced (a TVM workload's library)
    # a workload that generates tokens (builtin:llm-decode), what mlc-llm's benchmark reports:
    TTFT = "ttft"  # time to first token: the prefill of the prompt (ms)
    DECODE_LATENCY = "decode_latency"  # one decode step, per generated token (ms)
    TOKENS_PER_S = "tokens_per_s"  # decode throughput (tokens per second; higher is better)
    BINARY_SIZE = "binary_size"  # the size of the build itself (its libraries): one value per build


# The names as a registry, built from the enum (no second list): the metric classes are registered
# ``of`` it (``service.compare.metrics.METRICS``), which refuses a name it lacks and lists, in
# ``missing()``, a name without its class. The config validates ``measure`` by the enum itself.
METRIC_NAMES: Registry[Metric] = Registry("metric", ((metric.value, metric) for metric in Metric))


# Metrics judged from the timed processes themselves (no processes of their own; the code size
# is of the library the first timed process compiled): a workload measured by one of them is
# timed too.
FROM_TIMED_PROCESSES = (Metric.CPU_TIME, Metric.MAX_RSS, Metric.CODE_SIZE, Metric.TTFT, Metric.DECODE_LATENCY,
                        Metric.TOKENS_PER_S)
# What a token generation reports beside its samples (one value per generation): only a workload
# that generates tokens is measured by them, and such a workload is by default.
GENERATION = (Metric.TTFT, Metric.DECODE_LATENCY, Metric.TOKENS_PER_S)


# Metrics whose verdicts a workload's result shows under keys of their own (compile, instructions,
# compile_instructions: shapes older than the registry); every other metric's are its ``metrics``.
SHOWN_APART = (Metric.TIME, Metric.INSTRUCTIONS)

# Metrics of the build itself, not of a workload: judged once per run between its two builds, a
# series per build configuration (never in a workload's ``measure``).
OF_BUILDS = (Metric.BINARY_SIZE,)
# what a workload's ``measure`` may name
OF_WORKLOADS = tuple(m for m in Metric if m not in OF_BUILDS)


def series_name(metric: Metric, phase: str) -> str:
    """A metric's series as ``abwatch history --metric`` names it: ``max-rss`` for the run's,
    ``compile-max-rss`` for the compile's (phase ``compile-time``)."""
    return ("compile-" if phase == "compile-time" else "") + metric.value.replace("_", "-")


# every series name, for the command line's choices: a workload's, of the run and of the compile,
# then the builds' (``binary-size``)
SERIES = ([series_name(metric, phase) for phase in ("runtime", "compile-time") for metric in OF_WORKLOADS]
          + [series_name(metric, "build") for metric in OF_BUILDS])
