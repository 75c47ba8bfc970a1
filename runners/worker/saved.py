"""A workload's inputs and weights, saved beside its exported library by the compiling worker,
so a later timed worker (fresh, or a fork server's child) can run the library with TVM's
runtime library alone.

A later worker used to build its model again through the compiler's Python
(``relax.frontend``, ``te``, the user's script) only to make the same seeded inputs; a server
that imports the compiler takes about twice as long to start as one that imports the runtime
(``TVM_USE_RUNTIME_LIB=1``). So the compiling worker, asked to (``"save"`` in its spec), writes
what one call of the model takes into one ``.npz`` file, and workers given that file
(``"saved"``) load it instead of building. Loaded by path in the build's Python: numpy and the
standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any


def save(path: str, model, generative: str | None) -> None:
    """Write what one call of ``model`` (a ``sources.Model``) takes to ``path``: its inputs,
    weights, entry, and the output array a PrimFunc writes into; ``generative`` names the
    sibling module that times a generation (``llm``), where the model generates tokens."""
    import numpy as np

    arrays: dict[str, Any] = {f"input_{i}": np.asarray(x) for i, x in enumerate(model.inputs)}
    arrays.update({f"param_{i}": np.asarray(p) for i, p in enumerate(model.params)})
    if model.out is not None:
        arrays["out"] = np.asarray(model.out)
    for name, array in arrays.items():
        # numpy's own dtypes only: an object array would need pickle, and an extension type
        # (ml_dtypes' bfloat16) comes back as raw bytes; such a model's workers build it again
        if array.dtype.hasobject or not array.dtype.isbuiltin:
            raise ValueError(f"{name} has dtype {array.dtype}, which numpy cannot save as is")
    meta = {"entry": model.entry, "is_vm": model.is_vm, "inputs": len(model.inputs), "params": len(model.params),
            "out_shape": model.out_shape, "operator": model.operator, "generative": generative}
    partial = f"{path}.{os.getpid()}.partial"  # each writer its own: a build's two compiling workers may race
    try:
        with open(partial, "wb") as handle:
            np.savez(handle, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(partial, path)  # a child never reads half a file
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def load(path: str, model_class):
    """The model saved at ``path`` as a ``model_class`` (``sources.Model``) with no module
    (the library is loaded instead), and the name of its generation's sibling module or None."""
    import numpy as np

    with np.load(path, allow_pickle=False) as saved:
        meta = json.loads(str(saved["meta"]))
        inputs = [saved[f"input_{i}"] for i in range(meta["inputs"])]
        params = [saved[f"param_{i}"] for i in range(meta["params"])]
        out = saved["out"] if "out" in saved.files else None
    model = model_class(None, meta["entry"], inputs, meta["is_vm"], params, out=out,
                        out_shape=meta["out_shape"], operator=meta["operator"])
    return model, meta["generative"]
