"""A device's fingerprint: the part of its description that, when it changes, makes its
measurements another series.

A runner's :meth:`~abwatch.runners.base.Runner.prepare` puts it on
:class:`~abwatch.runners.results.DeviceInfo` (``fingerprint``: :func:`host_fingerprint` for the
cpu and gpu runners, :func:`board_fingerprint` for an rpc board); the service stores it, and
its :func:`digest`, on the device's row, so every run names the hardware it measured on. Its
fields (:data:`FIELDS`), each present only where the runner knows it:

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
"""

from __future__ import annotations

import json
from typing import Any

from abwatch.builders.spec import spec_hash
from abwatch.runners.sysinfo import cpu_flags

FIELDS = ("cpu_model", "cpu_flags", "cores", "memory_gib", "kernel", "machine", "device_api", "gpus",
          "rpc_key", "target")
LABELS = {"cpu_model": "cpu model", "cpu_flags": "cpu flags", "cores": "cores", "memory_gib": "memory (GiB)",
          "kernel": "kernel", "machine": "architecture", "device_api": "device API", "gpus": "gpus",
          "rpc_key": "board", "target": "target"}
FLAGS_NAMED = 6  # flags a change names one by one; the rest are counted


def target_string(target: dict[str, Any] | str | None) -> str:
    """A TVM target as a target string: a table's ``kind`` first, then ``-key=value`` sorted by
    key (lists joined by commas); a string with its spaces normalised."""
    if target is None:
        return ""
    if isinstance(target, str):
        return " ".join(target.split())
    options = []
    for key in sorted(k for k in target if k != "kind"):
        value = target[key]
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        options.append(f"-{key}={value}")
    return " ".join([str(target.get("kind", "")), *options]).strip()


def _gib(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def host_fingerprint(hardware: dict[str, Any], software: dict[str, Any], target: dict[str, Any] | str | None) -> dict[str, Any]:
    """The fingerprint of this machine, from a runner's ``hardware_config`` (:func:`.sysinfo.hardware_config`,
    with the gpu runner's ``device_api`` and ``gpus``) and ``software_config``, its CPU flags
    read here, and the runner's TVM target."""
    found: dict[str, Any] = {
        "cpu_model": hardware.get("cpu_platform"), "cpu_flags": cpu_flags(), "cores": hardware.get("cpu_count"),
        "memory_gib": _gib(hardware.get("memory_GB")), "kernel": software.get("kernel"),
        "machine": hardware.get("machine"), "device_api": hardware.get("device_api"),
        "target": target_string(target),
    }
    if hardware.get("gpus") is not None:
        found["gpus"] = [{"name": g.get("name"), "driver": g.get("driver"),
                          "memory_gib": _gib(g["memory_bytes"] / 2**30) if g.get("memory_bytes") else None}
                         for g in hardware["gpus"]]
    return {k: v for k, v in found.items() if v not in (None, "", [])}


def board_fingerprint(key: str, target: dict[str, Any] | str | None) -> dict[str, Any]:
    """The fingerprint of an rpc board: its tracker key and the target (abwatch reads nothing of
    the board's hardware; the host that compiles for it is not the device)."""
    return {"rpc_key": key, "target": target_string(target)}


def digest(fingerprint: dict[str, Any]) -> str:
    """The fingerprint's hash (16 hex digits, :func:`~abwatch.builders.spec.spec_hash`): a device
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
    for field in [*FIELDS, *sorted((set(old) | set(new)) - set(FIELDS))]:
        before, after = old.get(field), new.get(field)
        if before == after:
            continue
        label = LABELS.get(field, field)
        if field == "cpu_flags":
            added = sorted(set(after or ()) - set(before or ()))
            gone = sorted(set(before or ()) - set(after or ()))
            named = [f"+{f}" for f in added] + [f"-{f}" for f in gone]
            more = len(named) - FLAGS_NAMED
            said.append(f"{label} {' '.join(named[:FLAGS_NAMED])}" + (f" and {more} more" if more > 0 else ""))
        else:
            said.append(f"{label} {_shown(field, before)} -> {_shown(field, after)}")
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
