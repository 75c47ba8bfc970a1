"""The built-in LLM decode workload (``builtin:llm-decode``): a small decoder-only transformer
with an explicit KV cache, written with ``relax.frontend.nn``, and its generation timed the way
mlc-llm's benchmark times one.

Loaded by ``tvm_worker.py`` beside it (the name is registered in ``builtin_models.GENERATIVE``),
in the build's Python: TVM, numpy and the standard library only, never abwatch; TVM is imported
inside the functions that need it.

The model exports two functions, both taking the weights after their inputs:

- ``prefill(tokens[1, P])`` -> (logits of the last prompt token [1, 1, V], cache)
- ``decode(token[1, 1], cache)`` -> (logits [1, 1, V], cache one token longer)

The cache is an explicit tensor, ``[2 x layers, tokens so far, heads, head size]`` (each layer's
keys, then its values): each decode step appends its token's keys and values to every layer's
(a concatenation: the step returns the longer cache, which the next step takes). No positional
encoding: it would add a few element-wise operations and change nothing the benchmark compares.

One generation is the prefill of a seeded prompt, then ``decode_steps`` decode steps, each fed
a seeded next token (not the argmax of the logits, so that two builds whose logits differ in the
last bit still run the same steps, and their outputs compare), the device synchronised after
each step, as a sampler that reads the logits would. Of each generation it reports what
mlc-llm's benchmark does: the time to first token (the prefill, ms), the decode latency per
token (ms) and the decode throughput (tokens per second); its sample is the whole generation.
"""

from __future__ import annotations

import time

import numpy as np

# Small enough to compile and run in seconds on two CPU cores.
DEFAULTS = {"layers": 2, "hidden": 128, "heads": 4, "prompt_tokens": 32, "decode_steps": 16, "vocab": 512}
# The workload's entry function by name; what a call of it runs (timed, counted, instrumented,
# its output checked, on a GPU against the CPU) is a whole generation: :class:`Generation`.
ENTRY = "prefill"


def options_of(options: dict) -> dict:
    """The model's options: the workload's over :data:`DEFAULTS`, checked."""
    merged = {**DEFAULTS, **{k: v for k, v in options.items() if k in DEFAULTS}}
    for name, value in merged.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"builtin:llm-decode option {name} must be a positive integer, not {value!r}")
    if merged["hidden"] % merged["heads"]:
        raise ValueError(f"builtin:llm-decode: hidden ({merged['hidden']}) must be a multiple of heads "
                         f"({merged['heads']})")
    return merged


def decoder(options: dict):
    """The relax.frontend.nn decoder for ``options`` (:func:`options_of`)."""
    from tvm.relax.frontend import nn

    op = nn.op
    hidden, heads = options["hidden"], options["heads"]
    head_dim = hidden // heads

    def attend(q, k, v):
        # one query over a cache of symbolic length, by matmul and softmax (attention's own
        # lowering cannot prove the keys' and values' symbolic lengths equal)
        scores = op.matmul(op.permute_dims(q, [0, 2, 1, 3]), op.permute_dims(k, [0, 2, 3, 1])) * (head_dim ** -0.5)
        out = op.matmul(op.softmax(scores, axis=-1), op.permute_dims(v, [0, 2, 1, 3]))
        return op.permute_dims(out, [0, 2, 1, 3])

    class Layer(nn.Module):
        """A pre-norm decoder layer: causal self-attention over the cache, then an MLP."""

        def __init__(self):
            self.attn_norm, self.mlp_norm = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
            self.up, self.down = nn.Linear(hidden, 4 * hidden, bias=False), nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x, past):
            b, s, _ = x.shape
            q, k, v = (op.reshape(t, [b, s, heads, head_dim])
                       for t in op.split(self.qkv(self.attn_norm(x)), 3, axis=2))
            if past is None:  # the prompt: causal attention among its tokens
                attn = op.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # a decode step: its keys and values appended to the cache's, attended by the new token
                k, v = op.concat([past[0], k], dim=1), op.concat([past[1], v], dim=1)
                attn = attend(q, k, v)
            x = x + self.out(op.reshape(attn, [b, s, hidden]))
            return x + self.down(op.silu(self.up(self.mlp_norm(x)))), (k, v)

    class Decoder(nn.Module):
        def __init__(self):
            self.embed = nn.Embedding(options["vocab"], hidden)
            self.layers = nn.ModuleList([Layer() for _ in range(options["layers"])])
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, options["vocab"], bias=False)

        def _run(self, tokens, pasts):
            x, caches = self.embed(tokens), []
            for layer, past in zip(self.layers, pasts, strict=True):
                x, kv = layer(x, past)
                caches += kv
            if x.shape[1] != 1:  # the prompt: only its last token's logits are wanted
                x = op.split(x, [x.shape[1] - 1], axis=1)[1]
            return self.head(self.norm(x)), op.concat(caches, dim=0)

        def prefill(self, tokens):
            return self._run(tokens, [None] * options["layers"])

        def decode(self, token, cache):
            parts = op.split(cache, 2 * options["layers"], axis=0)  # [1, tokens so far, heads, head size] each
            return self._run(token, [(parts[2 * i], parts[2 * i + 1]) for i in range(options["layers"])])

    return Decoder()


def relax_module(spec: dict, rng: np.random.Generator):
    """(IRModule, seeded weights, seeded inputs) of the workload ``spec``: the inputs are the
    prompt ``[1, prompt_tokens]`` and the tokens fed to the decode steps ``[1, decode_steps]``."""
    from tvm.relax.frontend import nn

    dtype, given = spec["dtype"], spec.get("options", {})
    options = options_of(given)
    module = decoder(options)
    module.to(dtype)
    cache = [2 * options["layers"], "cache_len", options["heads"], options["hidden"] // options["heads"]]
    mod, params = module.export_tvm(spec={
        "prefill": {"tokens": nn.spec.Tensor([1, options["prompt_tokens"]], "int32")},
        "decode": {"token": nn.spec.Tensor([1, 1], "int32"), "cache": nn.spec.Tensor(cache, dtype)}})
    scale = float(given.get("weight_scale", 0.05))
    weights = [(rng.standard_normal([int(d) for d in p.shape]) * scale).astype(dtype) for _, p in params]
    tokens = [rng.integers(0, options["vocab"], size=(1, options[n])).astype("int32")
              for n in ("prompt_tokens", "decode_steps")]
    return mod, weights, tokens


class Generation:
    """One generation on a Relax VM: called with the workload's arguments (prompt, the decode
    steps' tokens, then the weights) it runs the prefill and every decode step and returns the
    last step's logits; :meth:`time` times generations."""

    def __init__(self, vm, dev) -> None:
        import tvm

        self.tvm, self.dev = tvm, dev
        self.prefill, self.decode = vm["prefill"], vm["decode"]
        self._steps: tuple[object, list] | None = None

    def steps(self, upcoming) -> list:
        """Each decode step's token as its own ``[1, 1]`` tensor on the device (made once)."""
        if self._steps is None or self._steps[0] is not upcoming:
            tokens = upcoming.numpy()
            self._steps = (upcoming, [self.tvm.runtime.tensor(tokens[:, i:i + 1].copy(), self.dev)
                                      for i in range(tokens.shape[1])])
        return self._steps[1]

    def __call__(self, prompt, upcoming, *weights):
        logits, cache = self.prefill(prompt, *weights)
        for token in self.steps(upcoming):
            logits, cache = self.decode(token, cache, *weights)
        return logits

    def time(self, args: list, repeat: int) -> tuple[list[float], dict[str, list[float]], list[float]]:
        """``repeat`` timed generations (after one untimed, as a time evaluator warms up): each
        one's whole time (ms), its figures by metric name, and its CPU time (ms, this process's:
        a sample's own, as ``usage.SampleClock`` marks a timed call's); each figure also on this
        process's CPU time (``<name>_cpu``), which the service judges instead under heavy
        contention, as it does the run time."""
        prompt, upcoming, weights = args[0], args[1], args[2:]
        steps = self.steps(upcoming)
        self(*args)
        samples: list[float] = []
        cpu_ms: list[float] = []
        series: dict[str, list[float]] = {f"{name}{clock}": [] for name in ("ttft", "decode_latency", "tokens_per_s")
                                          for clock in ("", "_cpu")}
        for _ in range(repeat):
            marks = [(time.perf_counter(), time.process_time())]
            logits, cache = self.prefill(prompt, *weights)
            self.dev.sync()
            marks.append((time.perf_counter(), time.process_time()))
            for token in steps:
                logits, cache = self.decode(token, cache, *weights)
                self.dev.sync()  # the token's logits are there before the next step, as a sampler needs
            marks.append((time.perf_counter(), time.process_time()))
            samples.append((marks[2][0] - marks[0][0]) * 1000.0)
            cpu_ms.append((marks[2][1] - marks[0][1]) * 1000.0)
            for clock, i in (("", 0), ("_cpu", 1)):
                # a CPU clock's tick can be coarser than a tiny model's step: never a zero
                prefill_s, decode_s = (max(marks[j + 1][i] - marks[j][i], 1e-9) for j in (0, 1))
                series["ttft" + clock].append(prefill_s * 1000.0)
                series["decode_latency" + clock].append(decode_s * 1000.0 / len(steps))
                series["tokens_per_s" + clock].append(len(steps) / decode_s)
        return samples, series, cpu_ms
