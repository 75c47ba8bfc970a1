"""A script workload written with ``relax.frontend.nn``: a transformer feed-forward block.

``workload(**options)`` receives the config's ``options`` as keyword arguments and returns
``(IRModule, inputs)``: here the inputs are the activation and the block's weights, scaled
so the values stay in range (plain random weights would overflow a deeper model).
"""

import numpy as np
from tvm.relax.frontend import nn


class FeedForward(nn.Module):
    """LayerNorm, up-projection, GELU, down-projection, residual."""

    def __init__(self, dim: int, hidden: int):
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(nn.op.gelu(self.up(self.norm(x))))


def workload(tokens: int = 16, dim: int = 128, hidden: int = 256):
    """The block exported for ``tokens`` x ``dim`` activations, with seeded inputs."""
    model = FeedForward(dim, hidden)
    mod, params = model.export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, tokens, dim], "float32")}})
    rng = np.random.default_rng(0)
    x = rng.standard_normal([1, tokens, dim]).astype("float32")
    weights = [(rng.standard_normal([int(d) for d in p.shape]) * 0.05).astype("float32") for _, p in params]
    return mod, [x, *weights]
