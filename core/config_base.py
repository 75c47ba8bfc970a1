"""What every config model builds on: the strict base model, the hash of a payload (cache
keys, series, watch identities), durations and environment variable names as configs write them.

The models themselves live with what they configure (``builders.spec``, ``builders.workload_spec``,
``service.config``); these few are what all of them share.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict


def spec_hash(payload: Mapping[str, Any]) -> str:
    """The short, stable hash of a JSON-able payload (cache keys, series, watch identities).

    Keys are sorted, so the order a payload was built in never changes the hash; 16 hex
    digits are what build rows, cache keys and watch rows have always stored.
    """
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# A duration in a config (``90``, ``90s``, ``30m``, ``6h``, ``2d``), or ``off``.
DURATION_OR_OFF = r"^\s*(?i:off|\d+(\.\d+)?\s*[smhd]?)\s*$"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def duration_s(text: str) -> float | None:
    """Seconds of a duration (``90``, ``90s``, ``30m``, ``6h``, ``2d``); None for ``off``."""
    match = _DURATION.match(text.lower())
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]] if match else None


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are errors (they are usually typos); frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# An environment variable's name (a config names the variable that holds a secret, never the secret)
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
