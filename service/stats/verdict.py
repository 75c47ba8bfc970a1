"""What is decided, as plain values: a comparison's outcome and verdict, a regression's state,
a person's triage decision.

Kept apart from :mod:`service.stats` (which computes verdicts with NumPy and SciPy) and from
:mod:`service.store.models` (which stores them with SQLAlchemy), so that what only reads, prints or
parses them — the reports, the command line's parser — imports neither stack.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from abwatch.core.metric_names import Metric  # noqa: F401 - re-exported: the one definition

# A false `same` costs a missed change smaller than about the threshold; a false
# `regression` costs a verify run, a bisection and an alert, so it keeps the stricter alpha.
DEFAULT_EQUIVALENCE_ALPHA = 0.05


class Outcome(str, enum.Enum):
    """The four answers; values are the strings stored and printed."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SAME = "same"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Verdict:
    """The result of :func:`compare` (percentages are of the control's median)."""

    verdict: Outcome
    change_pct: float | None
    ci_pct: tuple[float, float] | None
    p_value: float | None
    control_n: int
    treatment_n: int
    control_median_ms: float | None
    treatment_median_ms: float | None
    threshold_pct: float
    alpha: float
    confidence: float
    reason: str
    p_adjusted: float | None = None  # after a multiple-comparison correction, if one was applied
    correction: str = "none"
    stop_reason: str = ""  # why the runner stopped adding samples (set by adaptive callers)
    method: str = ""  # which estimator and interval decided (see the module docstring)
    looks: int = 0  # how many times the sequential rule judged the data (0: one fixed look)
    elapsed_s: float | None = None  # measuring time until the verdict (set by adaptive callers)
    # the interval that decides `same` (TOST at equivalence_alpha a side); None: ci_pct does
    same_ci_pct: tuple[float, float] | None = None
    equivalence_alpha: float = DEFAULT_EQUIVALENCE_ALPHA
    # The figures the verdict was judged on, in ms: the control's (``estimator`` says how it is
    # made) and the treatment's as the control's times the judged change, so that a report's two
    # figures always agree with its verdict (the medians above may not: they count pre-empted samples).
    control_ms: float | None = None
    treatment_ms: float | None = None
    estimator: str = ""
    # what the figures count: "ms", "cpu ms" (CPU time per process: judged so under heavy
    # contention, see stats.contention), or "instructions" for a verdict on instruction counts
    # (the fields named *_ms then hold instructions)
    unit: str = "ms"
    # what a reader must know of how the verdict was taken (heavy contention); also at the head
    # of ``reason``, and kept there when the verdict is decided again (Benjamini-Hochberg)
    caveat: str = ""
    # which way is worse: False (the default) for what is better lower (times, memory, counts),
    # True for what is better higher (an LLM's tokens per second): a drop is then the regression
    higher_is_better: bool = False
    # where pairs shared fork servers: how many times the server level grew the variance of the
    # change (service.stats.levels; 1.0: no variance between servers); None where none were shared
    design_effect: float | None = None

    def treatment_ci_ms(self) -> tuple[float, float] | None:
        """The interval of the change expressed in the treatment's milliseconds."""
        if self.control_ms is None or self.ci_pct is None:
            return None
        return (self.control_ms * (1 + self.ci_pct[0] / 100), self.control_ms * (1 + self.ci_pct[1] / 100))

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values: the one form a verdict is stored and sent in (a
        comparison's details, a regression's evidence, the API)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["verdict"] = self.verdict.value
        for key, value in data.items():  # JSON (and PostgreSQL's json) has no Infinity or NaN
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None
        for key in _INTERVALS:
            data[key] = list(data[key]) if data[key] is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict :meth:`to_dict` gave (keys it does not know, such as a ``run_id`` beside it,
        are left out)."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["verdict"] = Outcome(values["verdict"])
        for key in _INTERVALS:
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


_INTERVALS = ("ci_pct", "same_ci_pct")  # tuples in a Verdict, lists in JSON


class RegressionState(str, enum.Enum):
    """Escalation states: suspected, being verified, confirmed, cleared, or fixed by a later commit."""

    BENCHMARK = "benchmark"
    VERIFY = "verify"
    REGRESS = "regress"
    CLEARED = "cleared"
    FIXED = "fixed"


class TriageStatus(str, enum.Enum):
    """A person's decision about a confirmed regression (Perfherder / Skia Perf triage)."""

    ACKNOWLEDGED = "acknowledged"
    EXPECTED = "expected"
    INVALID = "invalid"
    WONTFIX = "wontfix"
    FIXED = "fixed"  # a later commit fixed it (the triage event names the commit)


# A regression triaged as one of these is no live problem: not a real one, or one a later commit
# fixed. No more alerts, shown apart.
SILENCED_TRIAGE = frozenset({TriageStatus.EXPECTED, TriageStatus.INVALID, TriageStatus.FIXED})


class RegressionKind(str, enum.Enum):
    """What a regression is about: each kind is judged, verified and bisected by its own verdict."""

    RUNTIME = "runtime"  # the run-time verdict: slower
    COMPILE_TIME = "compile-time"  # the compile-time verdict (TVM workloads): slower to compile
    CORRECTNESS = "correctness"  # outputs differ from the control's beyond the workload's tolerance


class Direction(str, enum.Enum):
    """Which way a stored change goes: a regression is ``slower``; a confirmed ``faster`` change
    (an improvement, kept only where ``[watch] bisect`` names "improvement") is verified and
    bisected the same way, so that its cause is named too, and is never shown or counted as a regression."""

    SLOWER = "slower"
    FASTER = "faster"

