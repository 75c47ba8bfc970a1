"""The benchmark harness: interleaved, balanced, seeded order; output parsing.

Control (A) and treatment (B) alternate in blocks of two pairs whose order is drawn at
random between ABBA and BAAB, so drift over time and position effects (first-runner
disadvantage) fall on both sides equally, unlike running all of A then all of B.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping

from abwatch.core.safejson import BadValue, loads, milliseconds
from abwatch.core.sides import CONTROL, TREATMENT, Side
from abwatch.runners.results import InvocationResult, TvmMetrics


class OutputError(Exception):
    """A workload printed something that is not the promised JSON lines."""


@dataclass(frozen=True)
class Slot:
    """One planned invocation: which side, its place in the order, whether it is warm-up."""

    side: Side
    position: int
    warmup: bool


def interleaved_schedule(repetitions: int, warmup: int, rng: random.Random, start: int = 0) -> list[Slot]:
    """Warm-up pairs first, then measured pairs, each block of two pairs ABBA or BAAB.

    ``start`` is the position of the first slot, so later batches continue the numbering.
    """
    sides: list[tuple[Side, bool]] = []
    for count, is_warmup in ((warmup, True), (repetitions, False)):
        pairs: list[tuple[Side, Side]] = []
        while len(pairs) < count:
            first, second = (CONTROL, TREATMENT) if rng.random() < 0.5 else (TREATMENT, CONTROL)
            pairs.extend([(first, second), (second, first)])
        for pair in pairs[:count]:
            sides.extend((side, is_warmup) for side in pair)
    return [Slot(side, start + index, is_warmup) for index, (side, is_warmup) in enumerate(sides)]


def _number(value: object, where: str) -> float:
    try:
        return milliseconds(value, where)
    except BadValue as exc:
        raise OutputError(str(exc)) from None


def parse_output(stdout: str, max_samples: int | None = None) -> tuple[tuple[float, ...], tuple[dict, ...]]:
    """Samples (ms) and whole records from a workload's stdout.

    Each non-empty line is a JSON object with ``runtime_ms``, or a TVM v0.1 record
    whose ``runtime_raw`` is a list of ``{"runtime_ms": ...}``. More than ``max_samples``
    samples is an error: none of them is kept.
    """
    samples: list[float] = []
    records: list[dict] = []
    # line by line: a list of every line of a large output would hold it twice in memory
    for number, line in enumerate(io.StringIO(stdout), start=1):
        if not line.strip():
            continue
        where = f"output line {number}"
        try:
            obj = loads(line, where)
        except json.JSONDecodeError:
            raise OutputError(f"{where} is not JSON: {line[:120]!r}") from None
        except BadValue as exc:
            raise OutputError(str(exc)) from None
        if not isinstance(obj, dict):
            raise OutputError(f"{where} is not a JSON object")
        if "runtime_raw" in obj:
            raw = obj["runtime_raw"]
            if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
                raise OutputError(f"{where}: runtime_raw must be a list of objects")
            samples.extend(_number(x.get("runtime_ms"), f"{where} runtime_raw") for x in raw)
            records.append(obj)
        elif "runtime_ms" in obj:
            samples.append(_number(obj["runtime_ms"], where))
        else:
            raise OutputError(f"{where} has neither runtime_ms nor runtime_raw")
        if max_samples is not None and len(samples) > max_samples:
            raise OutputError(f"more than {max_samples} samples in one invocation (at {where}); none kept "
                              "(raise the workload's max_samples if that many are expected)")
    if not samples:
        raise OutputError("workload printed no samples")
    return tuple(samples), tuple(records)


@dataclass(frozen=True)
class ProcessFigures:
    """How contended one measured process was: its wall time, the CPU time it used and the
    involuntary context switches it suffered (None where its kind does not measure them)."""

    position: int  # the invocation's place in the interleaved order (its samples' group)
    wall_s: float  # what the CPU figures cover: the whole process, or a TVM worker's timing batch
    cpu_s: float | None
    involuntary_switches: int | None
    threads: int = 1  # threads it ran on: CPU time can be that many times its wall time
    max_rss_kb: int | None = None  # its peak resident memory (or its timed region's)
    # the figures of each token generation it timed, by metric name (InvocationResult.series)
    series: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    server: int | None = None  # the fork server it was a child of (InvocationResult.server)
    cpu_samples: tuple[float, ...] = ()  # each sample's CPU time, ms (InvocationResult.cpu_samples)


@dataclass
class Measurement:
    """What the interleaved invocations of one workload produced (warm-up excluded)."""

    samples: dict[str, list[float]]
    groups: dict[str, list[int]]  # the invocation (process) each sample came from
    records: dict[str, list[dict]]
    failure: str | None = None
    metrics: dict[str, list[TvmMetrics]] = field(default_factory=lambda: {CONTROL: [], TREATMENT: []})
    processes: dict[str, list[ProcessFigures]] = field(default_factory=lambda: {CONTROL: [], TREATMENT: []})


def measure(runner, artifacts: Mapping[str, Path], workload, schedule: list[Slot], timeout_s: float,
            on_invocation, into: Measurement | None = None) -> Measurement:
    """Run ``schedule`` for ``workload``; stop at the first failed or hung invocation.

    ``artifacts`` maps side -> artifact directory; ``on_invocation(slot, result)`` is called
    after each invocation (the driver stores it there, so nothing is lost if we stop).
    ``into`` continues an earlier measurement (adaptive repetitions add batches).
    """
    result_of = into or Measurement({CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []},
                                    {CONTROL: [], TREATMENT: []})
    for slot in schedule:
        result = runner.run(artifacts[slot.side], workload, timeout_s, slot.side)
        on_invocation(slot, result)
        if not take(result_of, slot, result):
            break
    return result_of


def take(into: Measurement, slot: Slot, result: InvocationResult) -> bool:
    """Add one invocation's ``result`` to ``into``; False (its failure noted there) when it failed."""
    if result.status != "ok":
        # A hung or crashing build is that build's failure, never a slowdown: stop here.
        into.failure = f"{slot.side} invocation {slot.position} {result.status}: {result.message}"
        return False
    if not slot.warmup:
        into.samples[slot.side].extend(result.samples)
        into.groups[slot.side].extend([slot.position] * len(result.samples))
        into.records[slot.side].extend(result.records)
        into.processes[slot.side].append(ProcessFigures(
            slot.position, result.usage_span_s, result.cpu_s, result.involuntary_switches,
            result.threads, result.max_rss_kb, result.series, result.server, result.cpu_samples))
    if result.metrics:
        into.metrics[slot.side].append(result.metrics)
    return True
