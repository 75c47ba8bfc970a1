"""The inputs a compiling TVM worker saves for later workers on TVM's runtime library alone
(``runners/worker/saved.py``): what one call of a model takes comes back as it was, and what
numpy cannot save as is is refused at the save (such a model's workers build it again)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

WORKER_DIR = Path(__file__).resolve().parent.parent / "runners" / "worker"


def sibling(name: str):
    """A worker module loaded by path, as the worker loads it (numpy and the standard library only)."""
    spec = importlib.util.spec_from_file_location(f"abwatch_{name}", WORKER_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


saved, sources = sibling("saved"), sibling("sources")


def test_a_models_inputs_weights_and_output_array_come_back_as_saved(tmp_path):
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((4, 8)).astype("float32"), np.array(7, dtype="int64")]  # a 0-d scalar too
    weights = [rng.standard_normal((8, 2)).astype("float16"), np.arange(6, dtype="int32").reshape(2, 3).T]
    model = sources.Model(None, "main", inputs, False, weights, out=np.zeros((4, 2), "float32"),
                          out_shape=[4, 2], operator="matmul")
    path = tmp_path / "w.inputs.npz"
    saved.save(str(path), model, "llm")
    back, generative = saved.load(str(path), sources.Model)
    assert generative == "llm" and back.mod is None and not back.is_vm
    assert (back.entry, back.out_shape, back.operator) == ("main", [4, 2], "matmul")
    for got, want in zip([*back.inputs, *back.params, back.out], [*inputs, *weights, model.out], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == ["w.inputs.npz"]  # no partial file left


@pytest.mark.parametrize("odd", [np.array([{"a": 1}], dtype=object), np.zeros(2, dtype=[("x", "f4")])])
def test_what_numpy_cannot_save_as_is_is_refused_and_nothing_is_written(tmp_path, odd):
    model = sources.Model(None, "main", [np.zeros(3, "float32"), odd], True)
    path = tmp_path / "w.inputs.npz"
    with pytest.raises(ValueError, match="input_1 has dtype .* which numpy cannot save as is"):
        saved.save(str(path), model, None)
    assert list(tmp_path.iterdir()) == []
