"""Per-operator attribution keeps the operators' features (pure functions)."""

from __future__ import annotations

from abwatch.service.compare.attribution import describe, op_table


def test_operator_rows_say_what_the_operator_is():
    conv = "fused_conv2d1_add2_relu"
    features = {conv: {"shapes": [[1, 64, 56, 56], [64, 64, 3, 3], [1, 64, 56, 56]],
                       "dtypes": ["float32", "float32", "float32"]}}
    control = [{"ops": {conv: 100.0, "matmul": 50.0}, "op_features": features}]
    treatment = [{"ops": {conv: 130.0, "matmul": 50.0}, "op_features": features}]
    rows = op_table(control, treatment, context={"num_threads": "4", "target": "llvm -mcpu=znver3"})
    top = rows[0]
    assert top["name"] == conv and top["features"] == "conv2d_add_relu 1x64x56x56 float32"
    assert top["shapes"][0] == [1, 64, 56, 56] and top["dtypes"][0] == "float32"
    assert (top["threads"], top["target"]) == ("4", "llvm -mcpu=znver3")
    assert top["share_pct"] == 100.0
    assert rows[1]["features"] == "matmul" and rows[1]["shapes"] is None  # TVM gave no shapes


def test_describe():
    assert describe("conv2d", {"shapes": [[1, 64, 56, 56]], "dtypes": ["float32"]}) == "conv2d 1x64x56x56 float32"
    assert describe("fused_dense3", None) == "dense"
