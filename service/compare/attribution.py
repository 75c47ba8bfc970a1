"""Per-operator attribution and output comparison for TVM workloads (pure functions).

The report has the shape of a tuning report: per operator the control and treatment time,
the change in percent, and its share of the whole change, largest contributors first.
"""

from __future__ import annotations

import base64
import re
import statistics
from typing import Any, NotRequired, TypedDict

import numpy as np

from abwatch.runners.results import OpFeatures, OutputTensor, TvmMetrics, WorkerReady


class OpRow(TypedDict):
    """One operator of the attribution table (times in µs, percentages of the control)."""

    name: str
    type: str
    control_us: float | None
    treatment_us: float | None
    change_pct: float | None
    share_pct: float | None  # its part of the whole change
    features: str  # e.g. ``conv2d 1x64x56x56 float32``
    shapes: list[list[int]] | None
    dtypes: list[str] | None
    threads: Any
    target: Any


class OutputDiff(TypedDict):
    """The treatment's first output against the control's."""

    max_abs: float | None
    max_rel: float | None
    mismatch: bool  # beyond rtol/atol, non-finite, or another shape: a correctness regression
    reason: str
    rtol: NotRequired[float]
    atol: NotRequired[float]


class TvmDetails(TypedDict):
    """What a TVM comparison adds to its verdict, stored in ``comparisons.details`` and shown
    by the reports (each side keyed ``control``/``treatment``)."""

    compile_ms: dict[str, float]
    ops: list[OpRow]
    op_features: dict[str, dict[str, OpFeatures]]
    error: OutputDiff
    workers: dict[str, WorkerReady]
    compile: NotRequired[dict[str, Any]]  # a verdict on compile time, where one was made


def op_type(name: str) -> str:
    """An operator's type from its kernel name: ``fused_matmul1_add1`` -> ``fused_matmul_add``."""
    return re.sub(r"\d+(?=(_|$))", "", name)


def _medians(batches: list[TvmMetrics]) -> dict[str, float]:
    per_op: dict[str, list[float]] = {}
    for metrics in batches:
        for name, us in (metrics.get("ops") or {}).items():
            if isinstance(us, (int, float)):
                per_op.setdefault(name, []).append(float(us))
    return {name: statistics.median(values) for name, values in per_op.items()}


def describe(op: str, features: OpFeatures | None) -> str:
    """How a person names an operator: ``conv2d 1x64x56x56 float32`` (type, first input's
    shape and dtype), or just its type when TVM gave no shapes."""
    kind = op_type(op).removeprefix("fused_")
    shapes = (features.get("shapes") if features else None) or []
    dtypes = (features.get("dtypes") if features else None) or []
    if not shapes:
        return kind
    return f"{kind} {'x'.join(str(d) for d in shapes[0])} {dtypes[0] if dtypes else ''}".strip()


def _features(batches: list[TvmMetrics]) -> dict[str, OpFeatures]:
    merged: dict[str, OpFeatures] = {}
    for metrics in batches:
        for name, features in (metrics.get("op_features") or {}).items():
            merged.setdefault(name, features)
    return merged


def op_table(control: list[TvmMetrics], treatment: list[TvmMetrics], limit: int = 20,
             context: WorkerReady | None = None) -> list[OpRow]:
    """Operators ranked by how much of the total time change each explains.

    ``control``/``treatment`` are the metrics of each timing batch (``{"ops": {name: us},
    "op_features": {name: {"shapes", "dtypes"}}}``); an operator's time is its median over
    the batches. Each row keeps the operator's features (type, shapes, dtypes, and from
    ``context`` the threads and target) and a ``features`` text such as ``conv2d 1x64x56x56 float32``.
    """
    a, b = _medians(control), _medians(treatment)
    features = {**_features(control), **_features(treatment)}
    context = context or WorkerReady()
    total_delta = sum(b.values()) - sum(a.values())
    rows = []
    for name in sorted(set(a) | set(b)):
        ca, cb = a.get(name), b.get(name)
        delta = (cb or 0.0) - (ca or 0.0)
        f = features.get(name)
        rows.append(OpRow(
            name=name, type=op_type(name), control_us=ca, treatment_us=cb,
            change_pct=(cb / ca - 1.0) * 100.0 if ca and cb is not None else None,
            share_pct=delta / total_delta * 100.0 if total_delta else None,
            features=describe(name, f), shapes=f.get("shapes") if f else None, dtypes=f.get("dtypes") if f else None,
            threads=context.get("num_threads"), target=context.get("target"),
        ))
    rows.sort(key=lambda r: abs((r["treatment_us"] or 0.0) - (r["control_us"] or 0.0)), reverse=True)
    return rows[:limit]


def _array(outputs: OutputTensor) -> np.ndarray:
    data = np.frombuffer(base64.b64decode(outputs["data"]), dtype=outputs.get("dtype", "float32"))
    return data.reshape(outputs["shape"]).astype(np.float64)


def output_error(control: OutputTensor, treatment: OutputTensor, rtol: float, atol: float) -> OutputDiff:
    """Max absolute and relative error of the treatment's output against the control's."""
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


def tvm_details(metrics: dict[str, list[TvmMetrics]], rtol: float, atol: float) -> TvmDetails | None:
    """What a TVM comparison adds: compile times, the operator table, the output error,
    and what each worker reported about itself (TVM version, target, threads); None when a
    side has no compiling invocation (nothing to compare)."""
    first = {side: next((m for m in batches if "outputs" in m), None) for side, batches in metrics.items()}
    control, treatment = first.get("control"), first.get("treatment")
    if control is None or treatment is None:
        return None
    return TvmDetails(
        compile_ms={"control": control["compile_ms"], "treatment": treatment["compile_ms"]},
        ops=op_table(metrics["control"], metrics["treatment"], context=treatment.get("ready")),
        op_features={side: _features(batches) for side, batches in metrics.items()},
        error=output_error(control["outputs"], treatment["outputs"], rtol, atol),
        workers={"control": control["ready"], "treatment": treatment["ready"]},
    )
