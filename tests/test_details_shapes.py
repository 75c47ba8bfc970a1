"""``comparisons.details`` has had three shapes; each row says (or shows) which it is, and the
readers take each (service/store/models.details_version, service/read/stored.py)."""

from __future__ import annotations

from abwatch.service.store.models import DETAILS_VERSION, details_version

VERDICT = {"verdict": "slower", "reason": "slower by 5.0 %", "threshold_pct": 1.0}


def test_a_row_written_now_says_its_shape():
    assert details_version({"version": DETAILS_VERSION, "verdict": VERDICT}) == DETAILS_VERSION == 3


def test_the_shapes_of_rows_written_before_the_version_are_read_from_their_keys():
    # 1: the verdict's fields flat beside a TVM workload's own
    assert details_version({"verdict": "slower", "reason": "x", "compile_ms": [1.0]}) == 1
    assert details_version(None) == details_version({}) == 1
    # 2: the whole verdict, and the compile's verdict whole under its key
    assert details_version({"verdict": VERDICT, "compile": {"verdict": "same", "control_ms": [1.0]}}) == 2
    # 3: the verdict whole; of the instructions only what its measurements row does not hold
    assert details_version({"verdict": VERDICT, "instructions": {"profile": {"main": [1, 2]}}}) == 3
