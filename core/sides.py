"""The two sides of every comparison: the control build (A) and the treatment build (B).

One enum for both, so a side is never a misspelt string. Its members are strings equal to
their values (``Side.CONTROL == "control"``, ``str(Side.CONTROL) == "control"``): the rows,
records and JSON written before it stay what they were.
"""

from __future__ import annotations

import enum


class Side(enum.StrEnum):
    """Which build of a comparison: the control (A, the base) or the treatment (B, the change)."""

    CONTROL = "control"
    TREATMENT = "treatment"


CONTROL = Side.CONTROL
TREATMENT = Side.TREATMENT
