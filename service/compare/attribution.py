"""Per-operator attribution for TVM workloads (pure functions).

The report has the shape of a tuning report: per operator the control and treatment time,
the change in percent, and its share of the whole change, largest contributors first. The
output check it carries is the workload kind's (:mod:`abwatch.runners.outputs`).
"""

from __future__ import annotations

import re
import statistics
from typing import Any, NotRequired, TypedDict

from abwatch.runners.outputs import OutputDiff, first_compiled
from abwatch.runners.results import OpFeatures, TvmMetrics, WorkerReady


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


def tvm_details(metrics: dict[str, list[TvmMetrics]], error: OutputDiff) -> TvmDetails | None:
    """What a TVM comparison adds: compile times, the operator table, the output check's
    result (``error``: the workload kind's, :meth:`~abwatch.runners.workload_kind.WorkloadKind.check_outputs`),
    and what each worker reported about itself (TVM version, target, threads); None when a
    side has no compiling invocation (nothing to compare)."""
    first = first_compiled(metrics)
    control, treatment = first.get("control"), first.get("treatment")
    if control is None or treatment is None:
        return None
    return TvmDetails(
        compile_ms={"control": control["compile_ms"], "treatment": treatment["compile_ms"]},
        ops=op_table(metrics["control"], metrics["treatment"], context=treatment.get("ready")),
        op_features={side: _features(batches) for side, batches in metrics.items()},
        error=error,
        workers={"control": control["ready"], "treatment": treatment["ready"]},
    )
