"""The sources of TVM models, one class each, by the name a config writes before the model's
colon (``builtin:mlp``, ``te:matmul``, ``onnx:<path>``, ``script:<path>``): :data:`SOURCES`.

Loaded by ``tvm_worker.py`` beside it, in the build's Python: TVM, numpy and the standard
library only (onnx for onnx: models), never abwatch. What the config may write is validated on
the host by ``MODEL_SOURCES`` (``builders/workload_spec.py``: each source's models and their
options); tests/test_toy_plugins.py checks that both name the same sources. A new source is a
:class:`Source` here with its line in :data:`SOURCES`, and its line in ``MODEL_SOURCES``.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np


class Model:
    """What a source builds: the module to compile and what one call of it takes.

    ``is_vm``: a Relax function run by the VM; otherwise a PrimFunc that writes its result
    into its last argument: ``out`` (that array as the source gave it) or, where None, an
    empty one of ``out_shape``. ``generative``: the module that times a generation (a model
    that generates tokens). ``operator``: a PrimFunc's name in the per-operator table.
    ``digest``: the SHA-256 of the file the model was read from, where it is reported.
    (A plain class: this module is loaded by path, outside ``sys.modules``, where a dataclass
    cannot resolve its annotations.)
    """

    def __init__(self, mod: Any, entry: str, inputs: list[np.ndarray], is_vm: bool,
                 params: list[np.ndarray] | None = None, *, out: np.ndarray | None = None,
                 out_shape: list[int] | None = None, generative: Any = None, operator: str | None = None,
                 digest: str | None = None) -> None:
        self.mod, self.entry, self.inputs, self.is_vm = mod, entry, inputs, is_vm  # mod: a tvm.IRModule
        self.params = params if params is not None else []
        self.out, self.out_shape, self.generative = out, out_shape, generative
        self.operator, self.digest = operator, digest


class Source(abc.ABC):
    """One source of models. ``sibling(name)`` loads a module beside this one (the worker's
    loader, which loads each once: an exception class caught by the worker stays one class)."""

    def __init__(self, sibling: Callable[[str], Any]) -> None:
        self.sibling = sibling

    @abc.abstractmethod
    def build(self, spec: dict, rng: np.random.Generator, target) -> Model:
        """The model ``spec["model"]`` names, with seeded inputs (and weights) from ``rng``;
        ``target`` is what it is compiled for."""

    def reports(self, model: Model) -> dict:
        """What the worker's ``ready`` says of ``model`` beyond what it says of every model."""
        return {}


class Builtin(Source):
    """``builtin:<name>``: ``relax.frontend.nn`` models with seeded weights (builtin_models.py),
    and those that generate tokens, each in its own module (llm.py)."""

    def build(self, spec: dict, rng: np.random.Generator, target) -> Model:
        from tvm.relax.frontend import nn

        name, dtype = spec["model"].partition(":")[2], spec["dtype"]
        models = self.sibling("builtin_models")
        if name in models.GENERATIVE:  # a model that generates tokens: its own module
            if spec.get("rpc"):  # each decode step would be a round trip to the board: the network timed
                raise ValueError(f"{spec['model']} is timed step by step from this process; it runs on this "
                                 "host's CPU or a GPU runner, not over RPC")
            generative = self.sibling(models.GENERATIVE[name])
            mod, weights, inputs = generative.relax_module(spec, rng)
            return Model(mod, generative.ENTRY, inputs, True, weights, generative=generative)
        module, shape = models.builtin(name, spec.get("input_shape"), dtype, spec.get("options", {}))
        module.to(dtype)
        mod, params = module.export_tvm(spec={"forward": {"x": nn.spec.Tensor(shape, dtype)}})
        scale = float(spec.get("options", {}).get("weight_scale", 0.05))
        weights = [(rng.standard_normal([int(d) for d in p.shape]) * scale).astype(dtype) for _, p in params]
        return Model(mod, "forward", [rng.standard_normal(shape).astype(dtype)], True, weights)


class Te(Source):
    """``te:<name>``: a single TE operator as a PrimFunc (builtin_models.py)."""

    def build(self, spec: dict, rng: np.random.Generator, target) -> Model:
        import tvm

        func, in_shapes, out_shape = self.sibling("builtin_models").te_function(spec)
        inputs = [rng.standard_normal([int(d) for d in s]).astype(spec["dtype"]) for s in in_shapes]
        return Model(tvm.IRModule({"main": func}), "main", inputs, False, out_shape=[int(d) for d in out_shape],
                     operator=spec["model"].partition(":")[2])


class Onnx(Source):
    """``onnx:<path>``: an ONNX file, checked against the config's md5, through TVM's importer."""

    def build(self, spec: dict, rng: np.random.Generator, target) -> Model:
        import onnx
        from tvm.relax.frontend.onnx import from_onnx

        name, dtype = spec["model"].partition(":")[2], spec["dtype"]
        with open(name, "rb") as handle:
            digest = hashlib.md5(handle.read()).hexdigest()
        if spec.get("md5") and digest != spec["md5"]:
            raise ValueError(f"{name}: md5 is {digest}, the config says {spec['md5']}")
        graph = onnx.load(name)
        shapes = {}
        for inp in graph.graph.input:
            dims = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
            shapes[inp.name] = spec.get("input_shape") or dims
        mod = from_onnx(graph, shape_dict=shapes, keep_params_in_input=False)
        inputs = [rng.standard_normal(s).astype(dtype) for s in shapes.values()]
        return Model(mod, "main", inputs, True)


class Script(Source):
    """``script:<path>``: the user's Python file (script.py), run with the target current, so it
    may schedule its kernels for the device; it reports the file's SHA-256."""

    def build(self, spec: dict, rng: np.random.Generator, target) -> Model:
        from tvm import relax

        script = self.sibling("script")
        with target:  # current while the script runs
            mod, inputs, digest = script.script_module(spec, rng)
        path = script.script_path(spec)
        entry = script.entry(path, mod)
        func = mod[entry]
        is_vm = isinstance(func, relax.Function)
        if inputs is None:
            inputs = [script.random_inputs(rng, shape, dtype) for shape, dtype in script.parameters(path, func, is_vm)]
        model = Model(mod, entry, inputs, is_vm, operator=entry, digest=digest)
        if not is_vm:  # a PrimFunc writes its results into its last argument(s)
            model.out_shape = list(inputs[-1].shape)
            model.out = inputs.pop()
        return model

    def reports(self, model: Model) -> dict:
        return {"script_sha256": model.digest}


# The sources by the name a config writes before the colon: the host's MODEL_SOURCES has the same names.
SOURCES: dict[str, type[Source]] = {"builtin": Builtin, "te": Te, "onnx": Onnx, "script": Script}
