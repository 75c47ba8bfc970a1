"""What explains a regression, read from the comparison that opened it (pure, on stored details).

A regression opened on instructions (run time or compile time) is explained by the functions
whose instructions grew most: the ``profile`` the counting stored beside the counts
(``service.compare.instructions.profile_details``: each side's median-count process, its top
functions, and the diff). A compile-time regression judged on wall time is explained the same
way when the compile's instructions were counted beside it, else there is no profile and the
explanation says so. A run-time regression judged on time is explained by the per-operator
table the timed runs measured (``ops`` in the details, ``service.compare.attribution``): its
largest changes. Nothing is measured again: a later reader sees what the run stored.

:func:`explain` gives one shape the API, the regression page, the pull request's comment and
alerts all show: ``what`` (``functions``, ``operators`` or None), ``rows`` (largest first),
``note`` and, where there is nothing to show, ``reason``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from abwatch.service.stats.verdict import Metric, RegressionKind
from abwatch.service.store.models import Comparison, Regression

OPERATORS = 10  # operator rows an explanation keeps


def explain(kind: RegressionKind | str, metric: Metric | str | None, details: Mapping[str, Any] | None) -> dict[str, Any]:
    """The explanation of a regression of ``kind`` opened on ``metric``, from its comparison's
    ``details``."""
    kind, metric = RegressionKind(kind), Metric(metric or Metric.TIME)
    details = details or {}
    if kind is RegressionKind.CORRECTNESS:
        return _none("a correctness regression is explained by its output error, not by a profile")
    if kind is RegressionKind.COMPILE_TIME:
        counted = details.get("compile_instructions")
        if metric is Metric.TIME and not counted:
            return _none("judged on the compile's wall time, and its instructions were not counted "
                         '(measure = [..., "instructions"] counts them): no profile is available')
        note = ("judged on the compile's wall time; the compile's instructions were counted beside it"
                if metric is Metric.TIME else "")
        return _functions(counted, "compile", note)
    if metric is Metric.INSTRUCTIONS:
        return _functions(details.get("instructions"), "run", "")
    return _operators(details.get("ops"))


def _none(reason: str) -> dict[str, Any]:
    return {"what": None, "rows": [], "note": "", "reason": reason}


def _functions(counted: Any, region: str, note: str) -> dict[str, Any]:
    """The functions that grew in the counted ``region`` ("compile" or "run")."""
    if not isinstance(counted, Mapping):
        return _none(f"the {region}'s instructions were not counted")
    profile = counted.get("profile")
    if not isinstance(profile, Mapping):
        return _none("no per-function profile was stored with these counts (counted before profiles were kept)")
    if not profile.get("grew") and profile.get("reason"):
        return _none(f"no per-function profile: {profile['reason']}")
    sides = {side: (profile.get(side) or {}).get("total") for side in ("control", "treatment")}
    return {"what": "functions", "rows": list(profile.get("grew") or []), "region": region,
            "source": counted.get("source"), "process": profile.get("process"), "totals": sides,
            "no_symbol": profile.get("no_symbol"),
            "note": note, "reason": None if profile.get("grew") else "no function ran more instructions"}


def _operators(ops: Any) -> dict[str, Any]:
    """The operators whose time changed most (the stored table is ranked that way already)."""
    if not isinstance(ops, list) or not ops:
        return _none("no per-operator table was measured (only a TVM workload's timed runs have one)")
    rows = [{"name": op.get("name"), "features": op.get("features"), "control_us": op.get("control_us"),
             "treatment_us": op.get("treatment_us"), "change_pct": op.get("change_pct"),
             "share_pct": op.get("share_pct")} for op in ops[:OPERATORS] if isinstance(op, Mapping)]
    return {"what": "operators", "rows": rows, "note": "", "reason": None}


def of_regression(session: Session, regression: Regression) -> dict[str, Any]:
    """The explanation of ``regression``, from the comparison that opened it."""
    comparison = session.get(Comparison, regression.comparison_id)
    return explain(regression.kind, regression.metric, _with_counters(comparison) if comparison is not None else None)


def _with_counters(comparison: Comparison) -> dict[str, Any]:
    """The comparison's details, each instruction profile with the counter that counted it: its
    ``measurements`` row's (since 0029 details keep the profile alone; before, the whole verdict)."""
    details = dict(comparison.details or {})
    for key, phase in (("instructions", "runtime"), ("compile_instructions", "compile-time")):
        kept = details.get(key)
        row = next((r for r in comparison.measurements
                    if r.phase.value == phase and r.metric.value == "instructions"), None)
        if isinstance(kept, Mapping) and "source" not in kept and row is not None:
            details[key] = {**kept, "source": row.source}
    return details
