"""The workloads built into the TVM harness worker: ``builtin:`` models (relax.frontend.nn
modules with seeded weights) and ``te:`` operators.

Loaded by ``tvm_worker.py`` from its own directory, in the build's Python (as
``region.py`` is): TVM and the standard library only, never abwatch. TVM is imported
inside each function, so loading this file costs nothing before the worker needs a model.
A new built-in model is a class and a branch in :func:`builtin`; one that generates tokens (a
prefill, then decode steps, timed as a generation) is a module of its own beside this one,
named in :data:`GENERATIVE`.
"""

from __future__ import annotations

# Built-in models that generate tokens -> the module beside this file that builds and times them
# (``relax_module``, ``Generation``; tvm_worker.py loads it): each one's own file, as the LLM's is.
GENERATIVE = {"llm-decode": "llm"}


def builtin(name: str, shape, dtype: str, options: dict):  # noqa: C901 - the models' classes, where tvm is imported
    """A relax.frontend.nn module for a built-in workload, and its input shape."""
    from tvm.relax.frontend import nn

    op = nn.op

    class MLP(nn.Module):
        def __init__(self, width: int, hidden: int, classes: int):
            self.fc1, self.fc2, self.fc3 = nn.Linear(width, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)

        def forward(self, x):
            return self.fc3(op.relu(self.fc2(op.relu(self.fc1(x)))))

    def pool(x):  # global average pooling from sum (nn has no pooling op)
        n, c, h, w = x.shape
        return op.reshape(op.sum(x, axis=[2, 3]), [n, c]) * (1.0 / (h * w))

    class CNN(nn.Module):
        def __init__(self, channels: int, classes: int):
            self.c1 = nn.Conv2D(channels, 16, 3, padding=1)
            self.c2 = nn.Conv2D(16, 32, 3, stride=2, padding=1)
            self.c3 = nn.Conv2D(32, 64, 3, stride=2, padding=1)
            self.fc = nn.Linear(64, classes)

        def forward(self, x):
            return self.fc(pool(op.relu(self.c3(op.relu(self.c2(op.relu(self.c1(x))))))))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            self.a = nn.Conv2D(cin, cout, 3, stride=stride, padding=1)
            self.b = nn.Conv2D(cout, cout, 3, padding=1)
            self.down = nn.Conv2D(cin, cout, 1, stride=stride) if stride != 1 or cin != cout else None

        def forward(self, x):
            skip = self.down(x) if self.down is not None else x
            return op.relu(self.b(op.relu(self.a(x))) + skip)

    class ResNet18(nn.Module):
        """ResNet-18's layout (batch norm folded away, as inference compilers do)."""

        def __init__(self, channels: int, classes: int):
            self.stem = nn.Conv2D(channels, 64, 7, stride=2, padding=3)
            widths, blocks, cin = [64, 128, 256, 512], [], 64
            for i, width in enumerate(widths):
                blocks += [Block(cin, width, 1 if i == 0 else 2), Block(width, width, 1)]
                cin = width
            self.blocks = nn.ModuleList(blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = op.relu(self.stem(x))
            for block in self.blocks:
                x = block(x)
            return self.fc(pool(x))

    class Transformer(nn.Module):
        """One pre-norm transformer encoder block."""

        def __init__(self, dim: int, heads: int):
            self.heads, self.dim = heads, dim
            self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = op.split(self.qkv(self.n1(x)), 3, axis=2)
            split = lambda t: op.reshape(t, [b, s, self.heads, d // self.heads])  # noqa: E731
            attn = op.scaled_dot_product_attention(split(q), split(k), split(v))
            x = x + self.proj(op.reshape(attn, [b, s, d]))
            return x + self.down(op.gelu(self.up(self.n2(x))))

    if name == "mlp":
        shape = shape or [1, 784]
        return MLP(shape[-1], options.get("hidden", 512), options.get("classes", 10)), shape
    if name == "cnn":
        shape = shape or [1, 3, 32, 32]
        return CNN(shape[1], options.get("classes", 10)), shape
    if name == "resnet18":
        shape = shape or [1, 3, 64, 64]
        return ResNet18(shape[1], options.get("classes", 1000)), shape
    if name == "transformer":
        shape = shape or [1, 32, 128]
        return Transformer(shape[-1], options.get("heads", 4)), shape
    raise ValueError(f"unknown built-in model {name!r} (mlp, cnn, resnet18, transformer, "
                     f"{', '.join(GENERATIVE)})")


def te_function(spec: dict):
    """A single TE operator as a PrimFunc, with its input shapes."""
    from tvm import te, topi

    name = spec["model"].partition(":")[2]
    dtype, options = spec["dtype"], spec.get("options", {})
    if name == "matmul":
        m, k, n = options.get("m", 256), options.get("k", 256), options.get("n", 256)
        a, b = te.placeholder((m, k), dtype, "A"), te.placeholder((k, n), dtype, "B")
        r = te.reduce_axis((0, k), "k")
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
        return te.create_prim_func([a, b, c]), [(m, k), (k, n)], (m, n)
    if name == "conv2d":
        shape = spec.get("input_shape") or [1, 16, 32, 32]
        cout, ksize = options.get("out_channels", 32), options.get("kernel", 3)
        data = te.placeholder(shape, dtype, "data")
        weight = te.placeholder((cout, shape[1], ksize, ksize), dtype, "weight")
        out = topi.nn.conv2d_nchw(data, weight, stride=1, padding=ksize // 2, dilation=1)
        return te.create_prim_func([data, weight, out]), [tuple(shape), weight.shape], out.shape
    raise ValueError(f"unknown te: operator {name!r} (matmul, conv2d)")
