"""A device's fingerprint read off this host (:func:`host_fingerprint`) or named for an rpc
board (:func:`board_fingerprint`), and a TVM target as a target string.

What the fingerprint holds, and how two of them are compared, summed up and hashed, is
:mod:`abwatch.core.device_identity`, below every layer: the service reads and shows
fingerprints without the runners.
"""

from __future__ import annotations

import json
from typing import Any

from abwatch.runners.sysinfo import cpu_flags


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


def _on_the_host(device: dict[str, Any]) -> bool:
    """A device API's device that is this host's CPU (pocl's ``CL_DEVICE_TYPE_CPU``, lavapipe's
    ``PHYSICAL_DEVICE_TYPE_CPU``): its memory is the host's (already in the fingerprint), and pocl
    sizes it from the memory free at the moment, so it would start a new series with the load."""
    return "CPU" in str(device.get("type") or "").upper()


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
                          "memory_gib": _gib(g["memory_bytes"] / 2**30) if g.get("memory_bytes")
                          and not _on_the_host(g) else None}
                         for g in hardware["gpus"]]
    return {k: v for k, v in found.items() if v not in (None, "", [])}


def board_fingerprint(key: str, target: dict[str, Any] | str | None) -> dict[str, Any]:
    """The fingerprint of an rpc board: its tracker key and the target (abwatch reads nothing of
    the board's hardware; the host that compiles for it is not the device)."""
    return {"rpc_key": key, "target": target_string(target)}
