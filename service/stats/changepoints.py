"""Step changes in a series of per-commit values (the history view), by Apache Otava."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

from abwatch.service.stats.core import _as_samples


@dataclass(frozen=True)
class StepChange:
    """A step in a series: values from ``index`` on differ from those before it."""

    index: int
    change_pct: float
    p_value: float


OTAVA_MISSING = ("change points need Apache Otava's algorithm: pip install --no-deps 'apache-otava==0.8.0' "
                 "(numpy and scipy are all it needs; its other dependencies are integrations abwatch does not use)")


def change_points(values: Sequence[float], *, window: int = 30, max_pvalue: float = 0.001,
                  min_magnitude_pct: float = 0.0) -> list[StepChange]:
    """Step changes in a series (one value per commit), by Apache Otava's E-Divisive
    variant (Fleming et al., "Hunter"): windowed split, then merge of weak points."""
    try:
        from otava.analysis import compute_change_points  # heavy import, only when needed
    except ImportError:
        raise ImportError(OTAVA_MISSING) from None

    series = [float(x) for x in _as_samples(values, "series")]
    if len(series) < 4:
        return []
    found, _weak = compute_change_points(series, window_len=max(window, 4), max_pvalue=max_pvalue,
                                         min_magnitude=min_magnitude_pct / 100.0)
    return [StepChange(int(cp.index), float(cp.stats.forward_change_percent()), float(cp.stats.pvalue))
            for cp in found]
