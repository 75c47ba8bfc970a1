"""A device's identity: its description (:class:`DeviceInfo`) and its fingerprint, the part
of that description that, when it changes, makes its measurements another series.

A runner's :meth:`~abwatch.runners.runner.Runner.prepare` puts the fingerprint on
:class:`DeviceInfo` (``fingerprint``: :func:`~abwatch.runners.fingerprint.host_fingerprint` for
the cpu and gpu runners, :func:`~abwatch.runners.fingerprint.board_fingerprint` for an rpc
board); the service stores it, and its :func:`digest`, on the device's row, so every run names
the hardware it measured on. Its fields (:data:`FIELDS`), each present only where the runner
knows it:

============  ==========================================================================
cpu_model     ``model name`` of /proc/cpuinfo (the platform's processor name elsewhere)
cpu_flags     the CPU's feature flags, sorted (``flags`` on x86, ``Features`` on Arm)
cores         logical CPUs (``os.cpu_count()``)
memory_gib    physical memory rounded to whole GiB (MemTotal moves by megabytes between
              kernels; a changed DIMM moves it by gigabytes)
kernel        the kernel release (``uname -r``)
machine       the architecture (``uname -m``)
device_api    the gpu runner's TVM device API (cuda, rocm, vulkan, opencl, metal)
gpus          each device its driver lists: name, driver, memory rounded to whole GiB
rpc_key       an rpc runner's board (its tracker key): the board's hardware is not read
target        the runner's TVM target, as a target string (``llvm -mcpu=native``)
============  ==========================================================================

Left out on purpose: the host name (a renamed machine is the same machine), the OS release
and the installed packages (the build's environment, not the device's), the thread count
(the run's setting, stored with the run).

What is said and compared of a fingerprint is here, below every layer; reading one off a host
stays with the runners (:mod:`abwatch.runners.fingerprint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from abwatch.core.config_base import spec_hash

FIELDS = ("cpu_model", "cpu_flags", "cores", "memory_gib", "kernel", "machine", "device_api", "gpus",
          "rpc_key", "target")
LABELS = {"cpu_model": "cpu model", "cpu_flags": "cpu flags", "cores": "cores", "memory_gib": "memory (GiB)",
          "kernel": "kernel", "machine": "architecture", "device_api": "device API", "gpus": "gpus",
          "rpc_key": "board", "target": "target"}
FLAGS_NAMED = 6  # flags a change names one by one; the rest are counted


@dataclass(frozen=True)
class DeviceInfo:
    """What :meth:`~abwatch.runners.runner.Runner.prepare` says about the device: stored on the device row and in
    every record (``hardware``, ``hardware_config``, ``software_config``, ``runtime_config``).

    ``fingerprint`` (this module's subject) is the part whose change starts a new series: the
    device row is one per (name, fingerprint)."""

    name: str  # the device's identity in the database
    kind: str  # the runner's kind
    hardware_config: dict[str, Any]
    software_config: dict[str, Any]
    runtime_config: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)


def digest(fingerprint: dict[str, Any]) -> str:
    """The fingerprint's hash (16 hex digits, :func:`~abwatch.core.config_base.spec_hash`): a device
    row's identity with its name."""
    return spec_hash(fingerprint)


def _gpus(value: Any) -> str:
    if not value:
        return "none"
    return "; ".join(f"{g.get('name')} ({g.get('driver')}"
                     + (f", {g['memory_gib']} GiB)" if g.get("memory_gib") else ")") for g in value)


def _shown(field: str, value: Any) -> str:
    if value is None:
        return "?"
    return _gpus(value) if field == "gpus" else str(value)


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, a phrase per field (``cpu model A -> B``, ``cpu
    flags +avx512f -sse4a``); the fields a newer abwatch adds are compared like the others."""
    if not old:
        return ["no fingerprint was stored before"]
    said = []
    for key in [*FIELDS, *sorted((set(old) | set(new)) - set(FIELDS))]:
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        label = LABELS.get(key, key)
        if key == "cpu_flags":
            added = sorted(set(after or ()) - set(before or ()))
            gone = sorted(set(before or ()) - set(after or ()))
            named = [f"+{f}" for f in added] + [f"-{f}" for f in gone]
            more = len(named) - FLAGS_NAMED
            said.append(f"{label} {' '.join(named[:FLAGS_NAMED])}" + (f" and {more} more" if more > 0 else ""))
        else:
            said.append(f"{label} {_shown(key, before)} -> {_shown(key, after)}")
    return said


# What summary() says of each key present (in this order): a person reads CPU, cores, memory,
# kernel, flags (counted), GPUs, board, target
SUMMARY_PARTS: tuple[tuple[str, Any], ...] = (
    ("cpu_model", lambda v, f: str(v)),
    ("cores", lambda v, f: f"{v} cores"),
    ("memory_gib", lambda v, f: f"{v} GiB"),
    ("kernel", lambda v, f: f"kernel {v}"),
    ("cpu_flags", lambda v, f: f"{len(v)} cpu flags"),
    ("gpus", lambda v, f: f"{f.get('device_api', 'gpu')}: {_gpus(v)}"),
    ("rpc_key", lambda v, f: f"board {v}"),
    ("target", lambda v, f: f"target {v}"),
)


def summary(fingerprint: dict[str, Any]) -> str:
    """One line a person reads: CPU, cores, memory, kernel, GPUs, board, target (flags counted)."""
    parts = []
    for key, say in SUMMARY_PARTS:
        value = fingerprint.get(key)
        # memory and GPUs are said when known, even as 0 or none; the rest when non-empty
        if value is None or (not value and key not in ("memory_gib", "gpus")):
            continue
        parts.append(say(value, fingerprint))
    return ", ".join(parts) or "no fingerprint"
