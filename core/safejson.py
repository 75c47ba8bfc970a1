"""JSON from outside (workload output, imported records, API bodies) checked at the edge.

Python's ``json`` accepts things that break later and differently per database: ``NaN`` and
``Infinity`` (invalid JSON on export, rejected by PostgreSQL's jsonb), integers of thousands of
digits (``ValueError`` past 4300 digits, out of range for every numeric column), nesting deep
enough for ``RecursionError``, and NUL characters (PostgreSQL text cannot hold them; SQLite
can, so the two databases would disagree). :func:`loads` rejects all of them with one
:class:`BadValue` naming where, so SQLite and PostgreSQL see the same limits.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # objects/arrays inside each other; real records nest 3-4 deep
MAX_STRING = 65536  # characters in one string value or key
MAX_INT = 2**63 - 1  # what a BIGINT (and SQLite's INTEGER) holds
MAX_MS = 1e9  # one sample of over 11 days is a unit error, not a measurement


class BadValue(ValueError):
    """A JSON document with a value abwatch will not store; the message names where."""


def _reject_constant(name: str) -> Any:
    raise BadValue(f"{name} is not a JSON number (use null or leave the field out)")


def loads(text: str | bytes, where: str) -> Any:
    """Parse JSON and check every value (see :func:`check`); raise :class:`BadValue`."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except BadValue as exc:
        raise BadValue(f"{where}: {exc}") from None
    except RecursionError:
        raise BadValue(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError:
        raise  # callers word syntax errors themselves (line numbers, excerpts)
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise BadValue(f"{where}: {exc}") from None
    check(value, where)
    return value


def check(value: Any, where: str, _depth: int = 0) -> None:
    """Raise :class:`BadValue` if ``value`` (parsed JSON) breaks a limit above."""
    if _depth > MAX_DEPTH:
        raise BadValue(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        _check_string(value, where)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_INT:
            raise BadValue(f"{where}: integer out of range (more than 64 bits)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise BadValue(f"{where}: {value} is not a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_string(key, f"{where}: key {key[:40]!r}")
            check(item, f"{where}.{key[:40]}", _depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check(item, f"{where}[{index}]", _depth + 1)


def _check_string(value: str, where: str) -> None:
    if "\x00" in value:
        raise BadValue(f"{where}: contains a NUL character (\\u0000)")
    if len(value) > MAX_STRING:
        raise BadValue(f"{where}: string of {len(value)} characters (at most {MAX_STRING})")


def milliseconds(value: Any, where: str) -> float:
    """A sample time in ms: a number, finite, 0 <= value <= :data:`MAX_MS`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(f"{where}: runtime_ms must be a number, got {str(value)[:40]!r}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise BadValue(f"{where}: runtime_ms out of range")
    value = float(value)
    if not math.isfinite(value) or not 0 <= value <= MAX_MS:
        raise BadValue(f"{where}: runtime_ms must be between 0 and {MAX_MS:g}, got {value!r}")
    return value
