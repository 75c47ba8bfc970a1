"""Statistics: pure functions over plain sequences of milliseconds; no database, no I/O.

The package's public API is re-exported here, so callers write ``stats.compare(...)``:

- :mod:`.core`: one comparison (:func:`compare`), the decision rule, FDR adjustment, planning;
- :mod:`.estimates`: :func:`compare`'s unpaired estimation paths, a function each;
- :mod:`.sequential`: the stopping rule (:func:`sequential_look`, :class:`Budget`);
- :mod:`.changepoints`: step changes in a series (:func:`change_points`);
- :mod:`.contention`: how contended the measured processes were (:func:`assess`), and a verdict
  taken under heavy contention judged on CPU time (:func:`on_cpu_time`, a process by :func:`cpu_figure`) or refused (:func:`refused`);
- :mod:`.levels`: the fork server as a level above the process (:func:`server_level`);
- :mod:`.pooled`: estimators for samples without process groups;
- :mod:`.exact`: a deterministic quantity (a size) judged from one value a side (:func:`compare_exact`);
- :mod:`.repetitions`: the samples a process and children a fork server that reach an interval
  fastest (:func:`choose_samples`, :func:`choose_children`);
- :mod:`.verdict`: the result types (:class:`Verdict`, :class:`Outcome`, regression states).
"""

# Importing this package must stay cheap: models import .verdict, and every CLI command
# imports models, while .core needs NumPy and SciPy (about a second). The API is therefore
# resolved on first use (PEP 562); type checkers see the plain imports below.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "changepoints": ("OTAVA_MISSING", "StepChange", "change_points"),
    "contention": ("CPU_UNIT", "Contention", "assess", "cpu_figure", "on_cpu_time", "refused"),
    "exact": ("compare_exact",),
    "levels": ("MIN_BLOCKS", "ServerLevel", "children_within", "server_level"),
    "repetitions": ("ChildrenChoice", "SamplesChoice", "choose_children", "choose_samples"),
    "core": ("DEFAULT_ALPHA", "DEFAULT_CONFIDENCE", "DEFAULT_PLAN_PAIRS", "DEFAULT_RESAMPLES",
             "DEFAULT_THRESHOLD_PCT", "MIN_PAIRS", "MIN_SAMPLES", "TRIM", "_decide", "_small_sample", "adjust_fdr",
             "compare", "fastest_median", "cs_multiplier", "cs_p_value", "planned_repetitions", "process_cv", "trimmed_mean_se"),
    "sequential": ("Budget", "Look", "sequential_look"),
    "verdict": ("DEFAULT_EQUIVALENCE_ALPHA", "Outcome", "Verdict"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "Budget",
    "CPU_UNIT",
    "ChildrenChoice",
    "Contention",
    "DEFAULT_ALPHA",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_EQUIVALENCE_ALPHA",
    "DEFAULT_PLAN_PAIRS",
    "DEFAULT_RESAMPLES",
    "DEFAULT_THRESHOLD_PCT",
    "Look",
    "MIN_BLOCKS",
    "MIN_PAIRS",
    "MIN_SAMPLES",
    "OTAVA_MISSING",
    "Outcome",
    "SamplesChoice",
    "ServerLevel",
    "StepChange",
    "TRIM",
    "Verdict",
    "_decide",
    "_small_sample",
    "adjust_fdr",
    "assess",
    "change_points",
    "children_within",
    "choose_children",
    "choose_samples",
    "compare",
    "compare_exact",
    "cpu_figure",
    "fastest_median",
    "cs_multiplier",
    "cs_p_value",
    "planned_repetitions",
    "on_cpu_time",
    "process_cv",
    "refused",
    "sequential_look",
    "server_level",
    "trimmed_mean_se",
]

if TYPE_CHECKING:
    from abwatch.service.stats.changepoints import OTAVA_MISSING, StepChange, change_points
    from abwatch.service.stats.contention import CPU_UNIT, Contention, assess, cpu_figure, on_cpu_time, refused
    from abwatch.service.stats.exact import compare_exact
    from abwatch.service.stats.levels import MIN_BLOCKS, ServerLevel, children_within, server_level
    from abwatch.service.stats.repetitions import ChildrenChoice, SamplesChoice, choose_children, choose_samples
    from abwatch.service.stats.core import (
        DEFAULT_ALPHA, DEFAULT_CONFIDENCE, DEFAULT_PLAN_PAIRS, DEFAULT_RESAMPLES, DEFAULT_THRESHOLD_PCT, MIN_PAIRS,
        MIN_SAMPLES, TRIM, _decide, _small_sample, adjust_fdr, compare, cs_multiplier, cs_p_value, fastest_median,
        planned_repetitions, process_cv, trimmed_mean_se,
    )
    from abwatch.service.stats.sequential import Budget, Look, sequential_look
    from abwatch.service.stats.verdict import DEFAULT_EQUIVALENCE_ALPHA, Outcome, Verdict


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
