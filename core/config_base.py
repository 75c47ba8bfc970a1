"""What every config model builds on: the strict base model, the hash of a payload (cache
keys, series, watch identities), durations and environment variable names as configs write them.

The models themselves live with what they configure (``builders.spec``, ``builders.workload_spec``,
``service.config``); these few are what all of them share.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import typing
from typing import Any
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from abwatch.core.plugins import Registry


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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation names: itself, a union's members, a list's or dict's items,
    and those a validator by kind may pick (:func:`abwatch.core.config_base.kind_validator`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if callable(models := getattr(getattr(annotation, "func", None), "models", None)):
        return list(models())
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def unknown_key_hint(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """``"; did you mean 'repetitions'?"`` for the unknown key at ``loc`` (pydantic's error
    location under ``root``), from the keys the model at that place knows; "" when none is close.
    A union's tag in the path (``build.tvm-source.x``) keeps every member in view."""
    models = [root]
    for part in loc[:-1]:
        if isinstance(part, int):  # a list's index
            continue
        inner = [m for model in models if (f := model.model_fields.get(part)) is not None
                 for m in _models_in(f.annotation) + [m for meta in f.metadata for m in _models_in(meta)]]
        models = inner or models
    known = sorted({name for model in models for name in model.model_fields})
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6) if loc else []
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_name(registry: Registry[Any], name: object) -> str:
    """``name`` if ``registry`` has it, else a pydantic error (``unknown kind; expected one of
    ...``) that keeps the place of the value it checks."""
    if not isinstance(name, str) or name not in registry:
        raise PydanticCustomError("unknown_kind", "unknown kind; expected one of {expected}{hint}",
                                  {"expected": registry.expected(), "hint": registry.hint(name)})
    return name


class KindValidator:
    """Validates a config section (a table with a ``kind``, ``default`` where it has none) by
    the config model of the entry its kind names in ``registry``, read when it is validated,
    so a plug-in registered later counts (see :func:`kind_validator`)."""

    def __init__(self, registry: Registry[Any], default: str, section: str) -> None:
        self.registry, self.default, self.section = registry, default, section

    def models(self) -> list[type[BaseModel]]:
        """The models a section may be validated by (an unknown key's hint looks in them)."""
        return list(dict.fromkeys(self.registry.config_of(name) for name in self.registry))

    def __call__(self, value: Any) -> BaseModel:
        if isinstance(value, BaseModel):
            kind = getattr(value, "kind", self.default)
        elif isinstance(value, dict):
            kind = value.get("kind", self.default)
        else:
            raise PydanticCustomError("dict_type", "input should be a table of the {section}'s keys",
                                      {"section": self.section})
        model = self.registry.config_of(_check_name(self.registry, kind))
        if isinstance(value, model):
            return value
        return model.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)


def kind_validator(registry: Registry[Any], default: str, section: str = "section") -> KindValidator:
    """The validator (for ``PlainValidator``) of a config section by the config model of the
    entry its ``kind`` names in ``registry`` (``default`` where it names none). An instance of
    that model is taken as it is; one of another model is validated again by its kind's. An
    unknown kind is an error at the section's key (``build: unknown kind; expected one of
    ...``); the model's errors keep their place (``build.command: field required``)."""
    return KindValidator(registry, default, section)
