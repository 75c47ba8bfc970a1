"""What a run measured of its two builds themselves (``build_measurements``): one row per
metric of the builds (``core.metric_names.OF_BUILDS``: ``binary_size``), judged once per run
between its control's and its treatment's build.

Not a ``measurements`` row (those are a comparison's, of one workload) and not a regression
(a regression is of one workload: its comparison, its open-regression key, its verify run and
bisection re-run a workload): a build's size is deterministic, so its verdict is final where
it is made, recorded here and counted in the run's exit status.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from abwatch.service.stats.verdict import Metric, Outcome
from abwatch.service.store.base import Base, _enum


class BuildMeasurement(Base):
    """One metric of a run's two builds: each side's figure, the verdict, the whole verdict
    (``judged``), the builds it was read from and who read it (``source``)."""

    __tablename__ = "build_measurements"
    __table_args__ = (UniqueConstraint("run_id", "metric"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    metric: Mapped[Metric] = mapped_column(_enum(Metric, "metric", 16, checked=False))  # the registry's names
    unit: Mapped[str] = mapped_column(String(16))
    verdict: Mapped[Outcome] = mapped_column(_enum(Outcome, "verdict"))
    change_pct: Mapped[float | None] = mapped_column(Float)
    control_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    treatment_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    control_value: Mapped[float | None] = mapped_column(Float)  # the figure each side is judged by
    treatment_value: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str | None] = mapped_column(String(32))  # what was read (elf .text, file bytes)
    failure: Mapped[str | None] = mapped_column(Text)  # why it was not judged
    judged: Mapped[dict[str, Any]] = mapped_column(JSON)  # the whole verdict (Verdict.to_dict)
