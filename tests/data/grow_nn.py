"""A script workload whose module grows with the build: ``ABWATCH_TEST_LAYERS`` (set by the
build's ``abwatch-artifact.json``, as a commit of a real TVM change would change what TVM
generates) Linear + ReLU layers of distinct widths, each its own kernels."""

import itertools
import os

import numpy as np
from tvm.relax.frontend import nn


class Chain(nn.Module):
    """Linear layers of the given widths, each followed by a ReLU."""

    def __init__(self, widths):
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in itertools.pairwise(widths)])

    def forward(self, x):
        for layer in self.layers:
            x = nn.op.relu(layer(x))
        return x


def workload(layers: int = 2):
    """The chain for a 1 x 32 activation, with seeded inputs and small weights."""
    layers = int(os.environ.get("ABWATCH_TEST_LAYERS", layers))
    widths = [32 + 8 * i for i in range(layers + 1)]
    mod, params = Chain(widths).export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, widths[0]], "float32")}})
    rng = np.random.default_rng(0)
    x = rng.standard_normal([1, widths[0]]).astype("float32")
    weights = [(rng.standard_normal([int(d) for d in p.shape]) * 0.05).astype("float32") for _, p in params]
    return mod, [x, *weights]
