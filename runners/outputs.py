"""The output check of a comparison: the treatment's output against the control's, within a
tolerance (pure functions).

A workload kind whose runs report their outputs (``tvm``: the first output tensor of each
side's compiling invocation) checks them with :func:`output_error`; a mismatch opens a
``correctness`` regression, separate from the speed verdict. NumPy is imported when a check
runs, not with the registry of workload kinds, which every config load imports.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict

from abwatch.runners.results import OutputTensor, TvmMetrics

if TYPE_CHECKING:
    import numpy as np


class OutputDiff(TypedDict):
    """The treatment's first output against the control's."""

    max_abs: float | None
    max_rel: float | None
    mismatch: bool  # beyond rtol/atol, non-finite, or another shape: a correctness regression
    reason: str
    rtol: NotRequired[float]
    atol: NotRequired[float]


def first_compiled(metrics: Mapping[str, list[TvmMetrics]]) -> dict[str, TvmMetrics | None]:
    """Each side's first invocation that reported outputs (the one that compiled), or None."""
    return {side: next((m for m in batches if "outputs" in m), None) for side, batches in metrics.items()}


def _array(outputs: OutputTensor) -> np.ndarray:
    import numpy as np

    data = np.frombuffer(base64.b64decode(outputs["data"]), dtype=outputs.get("dtype", "float32"))
    return data.reshape(outputs["shape"]).astype(np.float64)


def output_error(control: OutputTensor, treatment: OutputTensor, rtol: float, atol: float) -> OutputDiff:
    """Max absolute and relative error of the treatment's output against the control's."""
    import numpy as np

    a, b = _array(control), _array(treatment)
    if a.shape != b.shape:
        return OutputDiff(max_abs=None, max_rel=None, mismatch=True,
                          reason=f"output shape {list(b.shape)} != {list(a.shape)}")
    diff = np.abs(a - b)
    finite = np.isfinite(a).all() and np.isfinite(b).all()
    rel = diff / np.maximum(np.abs(a), np.finfo(np.float32).tiny)
    mismatch = (not finite) or not np.allclose(b, a, rtol=rtol, atol=atol)
    return OutputDiff(max_abs=float(diff.max()) if diff.size else 0.0, max_rel=float(rel.max()) if rel.size else 0.0,
                      rtol=rtol, atol=atol, mismatch=bool(mismatch),
                      reason="non-finite output" if not finite else "")
