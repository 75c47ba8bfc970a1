"""Per-operator times of a Relax model for the TVM harness worker: per kernel, the microseconds
it takes in one call of the model, and the shapes and dtypes of its arguments.

Loaded by ``tvm_worker.py`` from its own directory, in the build's Python (as
``builtin_models.py`` is): TVM, numpy and the standard library only, never abwatch. Two routes
give the same table, so run pages, attribution and profiles read it alike:

- **A device of this process** (the CPU, a GPU): the Relax VM's instrument hook around every
  call the model makes, the device synchronised before and after each kernel, so that a GPU's
  asynchronous work is charged to the kernel that queued it (on the CPU the sync costs
  nothing). The kernels run in place, on the model's own data (:func:`instrumented`).
- **An RPC board** (:class:`Board`): that hook is a Python function of this process, and RPC
  passes no function to the board (only modules, tensors and plain values), so the VM on the
  board cannot call it. The VM's board-side profiler (``VirtualMachine(..., profile=True)``,
  ``vm.profile``) was removed from TVM before 0.24 (0.26 and 0.27 have neither). So each
  kernel is timed *on the board* by its own ``time_evaluator``, which runs there, on the
  board's clock, synchronising its device around the calls:

  1. the kernels a call makes, and their arguments' shapes, come from a dry run of the VM on
     this host, whose hook lets the VM's builtins (allocation, shape checks) run and skips
     every kernel: nothing compiled for the board runs here;
  2. the kernels are exported a second time, as a library of their own (``*.kernels.so``
     beside the workload's, written by the worker that compiles, reused by later ones): the
     workload library's root module is the VM executable, and a time evaluator on the board
     looks up a module's own functions only, never its imports' (the kernels);
  3. on the board, each distinct call (kernel, argument shapes) gets seeded arguments of those
     shapes, and its time is the fastest of ten repeats of at least a millisecond each.

  These are kernels timed in isolation (warm caches, as in a micro-benchmark), not in place;
  both sides of a comparison are measured the same way, which is what attribution compares.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

# Per kernel on a board: the fastest of REPEATS repeats, each at least MIN_REPEAT_MS long
# (time_evaluator raises its call count to get there). The fastest, as the verdict takes each
# process's fastest sample: other processes' time slices only ever add to a repeat.
REPEATS = 10
MIN_REPEAT_MS = 1


def features(args) -> dict:
    """Shapes and dtypes of an operator's tensor arguments (inputs first, then outputs)."""
    shapes, dtypes = [], []
    for arg in args:
        shape, dtype = getattr(arg, "shape", None), getattr(arg, "dtype", None)
        if shape is None or dtype is None:
            continue
        try:
            shapes.append([int(d) for d in shape])
        except (TypeError, ValueError):  # a symbolic dimension
            continue
        dtypes.append(str(dtype))
    return {"shapes": shapes, "dtypes": dtypes}


def instrumented(vm, call, args, dev, found: dict) -> dict:
    """Per-operator time (µs) of one ``call(*args)`` on this process's device ``dev``, from the
    VM's instrument hook; ``found`` gets each operator's argument shapes and dtypes."""
    from tvm.runtime.vm import VMInstrumentReturnKind

    totals: dict[str, float] = {}
    started: list[int] = []

    def instrument(func, name, before_run, ret_value, *arguments):
        if name.startswith("vm.builtin."):  # allocation and shape checks, not operators
            return VMInstrumentReturnKind.NO_OP
        if before_run:
            if name not in found:
                found[name] = features(arguments)
            dev.sync()  # the clock must not include earlier asynchronous work
            started.append(time.perf_counter_ns())
        else:
            dev.sync()
            totals[name] = totals.get(name, 0.0) + (time.perf_counter_ns() - started.pop()) / 1000.0
        return VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    try:
        call(*args)
    finally:
        vm.set_instrument(lambda *a: VMInstrumentReturnKind.NO_OP)
    return totals


class Unmeasurable(Exception):
    """A kernel argument that cannot be remade on a board (neither a tensor nor a number)."""


def _argument(arg):
    """A kernel argument as the board will get it: ``(shape, dtype)`` for a tensor, a number as is."""
    if hasattr(arg, "shape") and hasattr(arg, "dtype"):
        return (tuple(int(d) for d in arg.shape), str(arg.dtype))
    if isinstance(arg, (bool, int, float)):
        return arg
    raise Unmeasurable(type(arg).__name__)


def kernel_calls(host_lib, entry: str, arrays: list) -> list[tuple[str, list]]:
    """The kernels that one call of ``entry`` makes, in order, each with its arguments (tensors
    as ``(shape, dtype)``): a dry run of ``host_lib`` (the workload library, loaded on this
    host) on this host's CPU in which the VM's builtins run and no kernel does."""
    import tvm
    from tvm import relax
    from tvm.runtime.vm import VMInstrumentReturnKind

    vm = relax.VirtualMachine(host_lib, tvm.cpu())
    kernels: dict[str, bool] = {}
    calls: list[tuple[str, list]] = []

    def instrument(func, name, before_run, ret_value, *args):
        if name not in kernels:  # compiled into the library: a kernel; else the runtime's own
            kernels[name] = bool(host_lib.implements_function(name, True))
        if not kernels[name]:
            return VMInstrumentReturnKind.NO_OP
        with contextlib.suppress(Unmeasurable):  # an argument no board can be given: left untimed
            calls.append((name, [_argument(a) for a in args]))
        return VMInstrumentReturnKind.SKIP_RUN

    vm.set_instrument(instrument)
    vm[entry](*[tvm.runtime.tensor(a) for a in arrays])
    return calls


def kernel_library(lib, path: str) -> str | None:
    """The kernels of the workload library ``path`` as a library of their own, beside it: the
    file a compiling worker (``lib`` is the compiled executable) writes, which later workers
    (``lib`` loaded from ``path``, no longer exportable) reuse; None when there is none."""
    kernels = os.path.splitext(path)[0] + ".kernels.so"
    if not os.path.exists(kernels):
        imports = getattr(getattr(lib, "mod", None), "imports", None)  # an executable's host code
        if not imports:
            return None
        imports[0].export_library(kernels)
    return kernels


def _tensor(argument: tuple, dev, rng: np.random.Generator):
    """A tensor of ``argument``'s shape and dtype on ``dev``: seeded normal values for floats (as
    the model's inputs), zeros otherwise (in range for an index)."""
    import tvm

    shape, dtype = argument
    try:
        kind = np.dtype(dtype).kind
    except TypeError:  # a dtype numpy lacks (bfloat16, float8): left as allocated
        return tvm.runtime.empty(shape, dtype, dev)
    values = rng.standard_normal(shape) if kind == "f" else np.zeros(shape)
    return tvm.runtime.tensor(values.astype(dtype), dev)


class Board:
    """The kernels of a workload on an RPC board, and the calls one model call makes to them."""

    def __init__(self, kernels, calls: list[tuple[str, list]], seed: int) -> None:
        self.kernels, self.calls, self.seed = kernels, calls, seed

    @classmethod
    def attach(cls, remote, lib, path: str, entry: str, arrays: list, seed: int) -> Board | None:
        """Find the kernels a call of ``entry`` makes (a dry run here) and load them on the board
        of session ``remote``; None, saying why on stderr, where that cannot be done (a library
        this host cannot load, no kernel library): the run goes on without per-operator times."""
        import tvm

        try:
            calls = kernel_calls(tvm.runtime.load_module(path), entry, arrays)
            kernels = kernel_library(lib, path)
            if kernels is None:
                raise RuntimeError(f"no kernel library beside {path}")
            remote.upload(kernels, target="kernels.so")
            return cls(remote.load_module("kernels.so"), calls, seed)
        except Exception as exc:  # noqa: BLE001 - per-operator times are extra: never fail the run
            print(f"per-operator times unavailable on the board: {type(exc).__name__}: {exc}", file=sys.stderr)
            return None

    def times(self, dev, found: dict) -> dict:
        """Per-operator time (µs) of one model call, each kernel timed on the board's device
        ``dev``; ``found`` gets each operator's argument shapes and dtypes."""
        rng = np.random.default_rng(self.seed)
        totals: dict[str, float] = {}
        measured: dict[tuple, float] = {}
        for name, args in self.calls:
            key = (name, tuple(args))
            if key not in measured:
                made = [_tensor(a, dev, rng) if isinstance(a, tuple) else a for a in args]
                timer = self.kernels.time_evaluator(name, dev, number=1, repeat=REPEATS, min_repeat_ms=MIN_REPEAT_MS)
                measured[key] = min(timer(*made).results) * 1e6
            totals[name] = totals.get(name, 0.0) + measured[key]
            if name not in found:
                tensors = [a for a in args if isinstance(a, tuple)]
                found[name] = {"shapes": [list(s) for s, _ in tensors], "dtypes": [d for _, d in tensors]}
        return totals
