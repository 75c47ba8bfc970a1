"""What the records say about the machine: hardware_config and software_config."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU's feature flags, sorted: ``flags`` (x86) or ``Features`` (Arm) of /proc/cpuinfo,
    the union over its processors (a big.LITTLE part may list them per core); empty elsewhere."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return sorted(flags)


def _os_name() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def hardware_config() -> dict:
    """CPU model, core count, memory and architecture of this machine."""
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return {
        "cpu_count": os.cpu_count(),
        "cpu_platform": _cpu_model(),
        "machine": platform.machine(),
        "memory_GB": round(pages * page_size / 2**30, 1),
        "hostname": socket.gethostname(),
    }


def software_config() -> dict:
    """OS, kernel, Python and the installed Python packages (name -> version)."""
    packages = {
        dist.metadata["Name"].lower(): dist.version
        for dist in metadata.distributions()
        if dist.metadata["Name"]
    }
    return {
        "os": _os_name(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "pip": dict(sorted(packages.items())),
    }
