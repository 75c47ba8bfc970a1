"""Script workloads (``script:PATH`` and ``script:repo:PATH``) in the TVM harness worker: run
the user's file, call its ``workload(**options)``, find the function to time and make its inputs.

Loaded by ``tvm_worker.py`` from its own directory, in the build's Python (as
``builtin_models.py`` is): TVM, numpy and the standard library only, never abwatch. The user's
code is hostile and fallible: every failure of it becomes a :class:`ScriptError` that names
its file and line, never this worker's traceback.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback

import numpy as np


class ScriptError(Exception):
    """A script workload that cannot be loaded or returned the wrong thing; names file and line."""


def script_path(spec: dict) -> str:
    """The script's file: a path in the config's world, or ``script:repo:`` in the build's src/."""
    name = spec["model"].partition(":")[2]
    if name.startswith("repo:"):
        return os.path.join(os.environ["ABWATCH_ARTIFACT"], "src", name[len("repo:"):])
    return name


def where(path: str, exc: BaseException) -> str:
    """``path:line`` of the innermost frame of ``exc`` that lies in the script (or just ``path``)."""
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return f"{path}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return f"{path}:{frames[-1].lineno}" if frames else path


def script_module(spec: dict, rng: np.random.Generator):
    """Run the user's script, call its ``workload(**options)``; (IRModule, inputs, its digest).

    Every failure of the user's code becomes a :class:`ScriptError` naming the file and line.
    """
    import importlib.util

    import tvm

    path = script_path(spec)
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read the script: {exc.strerror}") from None
    if spec.get("script_sha256") and digest != spec["script_sha256"]:
        raise ScriptError(f"{path}: changed since the config was read (SHA-256 {digest[:12]}, "
                          f"expected {spec['script_sha256'][:12]}); run again to start a new series")
    # A real module in sys.modules: TVMScript's parser reads a function's source through it.
    loader_spec = importlib.util.spec_from_file_location("abwatch_workload", path)
    if loader_spec is None or loader_spec.loader is None:
        raise ScriptError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[loader_spec.name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # its neighbours import as they would
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is reported as theirs
        raise ScriptError(f"{where(path, exc)}: {type(exc).__name__}: {exc}") from None
    function = getattr(module, "workload", None)
    if not callable(function):
        raise ScriptError(f"{path}: defines no function workload(**options)")
    try:
        result = function(**spec.get("options", {}))
    except Exception as exc:  # noqa: BLE001 - as above
        raise ScriptError(f"{where(path, exc)}: workload() raised {type(exc).__name__}: {exc}") from None
    mod, inputs = (result if isinstance(result, tuple) and len(result) == 2 else (result, None))
    if not isinstance(mod, tvm.IRModule):
        raise ScriptError(f"{path}: workload() returned {type(result).__name__}, expected an IRModule "
                          "or a tuple (IRModule, inputs)")
    if inputs is not None:
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(x, np.ndarray) for x in inputs):
            raise ScriptError(f"{path}: workload()'s inputs must be a list of numpy arrays")
        inputs = list(inputs)
    return mod, inputs, digest


def entry(path: str, mod):
    """The function a script module is timed by: ``main``, or its only function."""
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if "main" in names:
        return "main"
    from tvm import relax

    relax_functions = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    if len(relax_functions) == 1:
        return relax_functions[0]
    raise ScriptError(f"{path}: the module has no 'main' function (it has: {', '.join(sorted(names))})")


def parameters(path: str, func, relax_function: bool) -> list[tuple[list[int], str]]:
    """Shapes and dtypes of ``func``'s parameters (a PrimFunc's buffers), to make inputs from."""
    out = []
    for param in func.params:
        if relax_function:  # TVM 0.26+ types a parameter as `ty`; older releases as `struct_info`
            info = getattr(param, "ty", None) or getattr(param, "struct_info", None)
            shape, dtype = getattr(info, "shape", None), getattr(info, "dtype", None)
            shape = getattr(shape, "values", shape)
        else:  # a buffer parameter: through buffer_map, or (newer TIR) the parameter itself
            buffer = getattr(func, "buffer_map", {}).get(param, param)
            shape, dtype = getattr(buffer, "shape", None), getattr(buffer, "dtype", None)
        try:
            if shape is None:
                raise TypeError("no shape")
            out.append(([int(d) for d in shape], str(dtype)))
        except (TypeError, ValueError):
            raise ScriptError(f"{path}: parameter {param.name_hint!r} has no static shape; return "
                              "(module, inputs) from workload() to give its inputs") from None
    return out


def random_inputs(rng: np.random.Generator, shape: list[int], dtype: str) -> np.ndarray:
    """Seeded inputs of ``shape``: normal values for floats, small non-negative ones for integers."""
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 8, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.standard_normal(shape).astype(dtype)
