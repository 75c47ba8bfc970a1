"""Schemathesis hooks for the API's fuzzing (the CLI loads them from ``$SCHEMATHESIS_HOOKS``):
besides what the generator draws, path parameters also come with a NUL character in them and
as 6000-character strings, values its own strategies seldom reach in a few dozen examples."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

LONG = 6000


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> st.SearchStrategy:
    """The drawn parameters, or each of them with a NUL inside, NUL alone, or 6000 characters."""
    if not path_parameters:
        return st.just(path_parameters)
    variants = [path_parameters]
    for hostile in (lambda v: f"{v}\x00x", lambda v: "\x00", lambda v: (str(v) or "n") * LONG):
        variants.append({k: hostile(v)[:LONG] for k, v in path_parameters.items()})
    return st.sampled_from(variants)
