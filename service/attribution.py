"""Per-operator attribution and output comparison for TVM workloads (pure functions).

The report has the shape of a tuning report: per operator the control and treatment time,
the change in percent, and its share of the whole change, largest contributors first.
"""

from __future__ import annotations

import base64
import re
import statistics
from typing import Any

import numpy as np


def op_type(name: str) -> str:
    """An operator's type from its kernel name: ``fused_matmul1_add1`` -> ``fused_matmul_add``."""
    return re.sub(r"\d+(?=(_|$))", "", name)


def _medians(batches: list[dict]) -> dict[str, float]:
    per_op: dict[str, list[float]] = {}
    for metrics in batches:
        for name, us in (metrics.get("ops") or {}).items():
            if isinstance(us, (int, float)):
                per_op.setdefault(name, []).append(float(us))
    return {name: statistics.median(values) for name, values in per_op.items()}


def describe(op: str, features: dict | None) -> str:
    """How a person names an operator: ``conv2d 1x64x56x56 float32`` (type, first input's
    shape and dtype), or just its type when TVM gave no shapes."""
    kind = op_type(op).removeprefix("fused_")
    shapes, dtypes = (features or {}).get("shapes") or [], (features or {}).get("dtypes") or []
    if not shapes:
        return kind
    return f"{kind} {'x'.join(str(d) for d in shapes[0])} {dtypes[0] if dtypes else ''}".strip()


def _features(batches: list[dict]) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for metrics in batches:
        for name, features in (metrics.get("op_features") or {}).items():
            merged.setdefault(name, features)
    return merged


def op_table(control: list[dict], treatment: list[dict], limit: int = 20,
             context: dict | None = None) -> list[dict[str, Any]]:
    """Operators ranked by how much of the total time change each explains.

    ``control``/``treatment`` are the metrics of each timing batch (``{"ops": {name: us},
    "op_features": {name: {"shapes", "dtypes"}}}``); an operator's time is its median over
    the batches. Each row keeps the operator's features (type, shapes, dtypes, and from
    ``context`` the threads and target) and a ``features`` text such as ``conv2d 1x64x56x56 float32``.
    """
    a, b = _medians(control), _medians(treatment)
    features = {**_features(control), **_features(treatment)}
    context = context or {}
    total_delta = sum(b.values()) - sum(a.values())
    rows = []
    for name in sorted(set(a) | set(b)):
        ca, cb = a.get(name), b.get(name)
        delta = (cb or 0.0) - (ca or 0.0)
        f = features.get(name) or {}
        rows.append({
            "name": name, "type": op_type(name), "control_us": ca, "treatment_us": cb,
            "change_pct": (cb / ca - 1.0) * 100.0 if ca and cb is not None else None,
            "share_pct": delta / total_delta * 100.0 if total_delta else None,
            "features": describe(name, f), "shapes": f.get("shapes"), "dtypes": f.get("dtypes"),
            "threads": context.get("num_threads"), "target": context.get("target"),
        })
    rows.sort(key=lambda r: abs((r["treatment_us"] or 0.0) - (r["control_us"] or 0.0)), reverse=True)
    return rows[:limit]


def _array(outputs: dict) -> np.ndarray:
    data = np.frombuffer(base64.b64decode(outputs["data"]), dtype=outputs.get("dtype", "float32"))
    return data.reshape(outputs["shape"]).astype(np.float64)


def output_error(control: dict, treatment: dict, rtol: float, atol: float) -> dict[str, Any]:
    """Max absolute and relative error of the treatment's output against the control's."""
    a, b = _array(control), _array(treatment)
    if a.shape != b.shape:
        return {"max_abs": None, "max_rel": None, "mismatch": True,
                "reason": f"output shape {list(b.shape)} != {list(a.shape)}"}
    diff = np.abs(a - b)
    finite = np.isfinite(a).all() and np.isfinite(b).all()
    rel = diff / np.maximum(np.abs(a), np.finfo(np.float32).tiny)
    mismatch = (not finite) or not np.allclose(b, a, rtol=rtol, atol=atol)
    return {"max_abs": float(diff.max()) if diff.size else 0.0, "max_rel": float(rel.max()) if rel.size else 0.0,
            "rtol": rtol, "atol": atol, "mismatch": bool(mismatch),
            "reason": "non-finite output" if not finite else ""}


def tvm_details(metrics: dict[str, list[dict]], rtol: float, atol: float) -> dict[str, Any]:
    """What a TVM comparison adds: compile times, the operator table, the output error,
    and what each worker reported about itself (TVM version, target, threads)."""
    first = {side: next((m for m in batches if "outputs" in m), None) for side, batches in metrics.items()}
    if any(value is None for value in first.values()):
        return {}
    return {
        "compile_ms": {side: m["compile_ms"] for side, m in first.items()},
        "ops": op_table(metrics["control"], metrics["treatment"],
                        context=first["treatment"].get("ready") or {}),
        "op_features": {side: _features(batches) for side, batches in metrics.items()},
        "error": output_error(first["control"]["outputs"], first["treatment"]["outputs"], rtol, atol),
        "workers": {side: m["ready"] for side, m in first.items()},
    }
