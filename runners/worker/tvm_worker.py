"""The TVM harness worker: runs inside one build's Python, compiles a workload once, then
serves timing batches over stdin/stdout (one JSON object a line each way).

It imports only TVM, numpy, the standard library (and onnx for onnx: models; a script:
model's own imports): never abwatch, which lives in another environment. Protocol:

    -> {"model": ..., "input_shape": ..., "dtype": ..., "options": {...}, "target": {...},
        "device": "cpu"|"cuda", "number": N, "repeat": R, "seed": S, "rpc": null|{...},
        "compile_only": bool, "count": null|"valgrind"|"perf"}
        (compile_only: report compile_ms, touch no device, then exit; count: count the
        instructions of the compile call, or with "count_run" of the timed calls; "export":
        where to write the compiled library, "load": the library to load instead; "save": where
        to write the inputs and weights too, "saved": take them from there, building nothing:
        saved.py; "cpus": the CPUs a forked child of a duet pins itself to before anything else)
    <- {"ready": true, "compile_ms": ..., "tvm_version": ..., "inputs": {...},
        "instructions": {...} (compile_only with count), "max_rss_kb": (compile_only)} | {"error": ...}
    -> {"cmd": "run"}      <- {"samples": [ms, ...], "ops": {name: us},
                               "usage": {"wall_s", "cpu_s", "involuntary_switches", "max_rss_kb"} | null}
       (usage: the timing batch's wall time, this process's CPU time over it (all threads),
       the kernel's preemptions of it and its peak memory (usage.py); on the host CPU
       only, not over RPC or on a GPU; a model that generates tokens (llm.py) times one
       generation a sample and adds "series": {"ttft": [ms, ...], "decode_latency": [ms, ...],
       "tokens_per_s": [...], and each on CPU time: "ttft_cpu", ...}, one value a sample)
    -> {"cmd": "count_run"}  <- {"instructions": {...}, "calls": N}  (N = number)
    -> {"cmd": "outputs"}  <- {"shape": [...], "dtype": "float32", "data": base64}
    -> {"cmd": "exit"}

A fork server (counted workers) is started with ``{"fork": true}`` instead of a workload
(timed workers: ``{"fork": true, "timed": true}``, which also imports what workloads use and
shifts each child's stack and heap by a random amount; started with ``TVM_USE_RUNTIME_LIB=1``,
it imports TVM's runtime library alone, for children given ``"saved"``):

    <- {"forking": true, "tvm_version": ..., "libraries": [the libtvm*.so files it mapped]}
    -> {"cmd": "fork"}  <- {"child": pid, "layout": {"stack_depth": n, "heap_bytes": n} (timed)}
       then the conversation above with the forked child, from its spec to its "exit";
       <- {"forked": true, "status": exit status}
"""

from __future__ import annotations

import base64
import functools
import gc
import json
import os
import sys
import tempfile
import time
import traceback

# This file's directory holds abwatch's own modules; none of them may shadow TVM's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import numpy as np  # noqa: E402


@functools.cache  # each sibling loaded once: its classes (ScriptError) stay one class
def _sibling(name: str):
    """The module ``name``.py beside this file (``region``, ``builtin_models``), loaded by
    path: this file's directory is not on ``sys.path``, so abwatch's modules never shadow TVM's."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"abwatch_{name}", path)
    assert spec is not None and spec.loader is not None  # a .py file's path always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _region(counter: str):
    """A :class:`region.Region` for ``counter``."""
    return _sibling("region").Region(counter)


def _protocol_stream():
    """Keep the real stdout for the protocol; anything TVM prints goes to stderr instead."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


class Workload:
    """A compiled workload, its device, inputs, and how to time it."""

    def __init__(self, spec: dict) -> None:
        import tvm

        self.tvm, self.spec = tvm, spec
        self.compile_ms: float | None = None
        self.region, self.instructions, self.remote, self.device = None, None, None, None
        self.reference: tuple | None = None  # (the CPU module, the device module): the device's output checked
        self.target: str | None = None
        self.reports: dict = {}
        if spec.get("saved"):  # a later worker on the runtime library alone: nothing here may need the compiler
            model, generative = _sibling("saved").load(spec["saved"], _sibling("sources").Model)
            on_device = None
            self._take(model, _sibling(generative) if generative else None)
            lib = tvm.runtime.load_module(spec["load"])
        else:
            lib, on_device = self._build(spec)
        if spec.get("compile_only"):  # timing the compiler: no device, nothing to run
            return
        if spec.get("rpc"):
            lib = self._upload(lib, spec.get("load") or spec.get("export"))
        self.dev = self.remote.device(spec["device"]) if self.remote else tvm.device(spec["device"])
        self.device = on_device.describe(self.dev) if on_device is not None else None
        self.args = [tvm.runtime.tensor(x, self.dev) for x in self.inputs + list(self.params)]
        self.clock = self._clock(spec)
        self.marked = None  # the timer whose repeats the clock marks (see run)
        if self.is_vm:
            from tvm.runtime import vm  # relax's VM, in TVM's runtime library

            self.vm = vm.VirtualMachine(lib, self.dev)
            self.call = self.callable(self.vm, self.dev)
            self.timer = (None if self.generative is not None else
                          self.vm.time_evaluator(self.entry, self.dev, number=spec["number"], repeat=spec["repeat"]))
            if self.clock is not None and self.timer is not None:
                self.marked = self.vm.time_evaluator(self.entry, self.dev, number=spec["number"],
                                                     repeat=spec["repeat"], f_preproc=self.clock.name)
        else:
            if self.out_array is not None:  # the output array the model came with (a script's)
                self.out = tvm.runtime.tensor(self.out_array, self.dev)
            else:
                self.out = tvm.runtime.empty(self.out_shape, spec["dtype"], self.dev)
            self.args.append(self.out)
            lib = getattr(lib, "mod", lib)  # an Executable wraps the runtime module
            self.call = lib[self.entry]
            self.timer = lib.time_evaluator(self.entry, self.dev, number=spec["number"], repeat=spec["repeat"])
            if self.clock is not None:
                self.marked = lib.time_evaluator(self.entry, self.dev, number=spec["number"], repeat=spec["repeat"],
                                                 f_preproc=self.clock.name)

    def _batch_timer(self):
        """The timer of this batch: the one whose repeats the clock marks where a sample is long
        enough (:data:`usage.MARK_MIN_S` of CPU, by one call timed here, untimed by the batch),
        else the plain one. A mark calls into Python between two samples, which leaves the next
        one's caches a little colder: ~1 % of a 0.8 ms sample, nothing of a 5 ms one."""
        if self.marked is None:
            return self.timer
        started = time.process_time()
        self.call(*self.args)
        long = (time.process_time() - started) * self.spec["number"] >= _sibling("usage").MARK_MIN_S
        return self.marked if long else self.timer

    def _clock(self, spec: dict):
        """Each sample's CPU time (usage.SampleClock) where the samples run on this host's CPU;
        None on a board, a GPU, or a TVM that cannot register the mark."""
        if spec["device"] != "cpu" or spec.get("rpc"):
            return None
        try:
            return _sibling("usage").SampleClock(self.tvm)
        except (AttributeError, TypeError):  # an older TVM: no Python global functions, no f_preproc
            return None

    def _take(self, model, generative) -> None:
        """Keep what one call of ``model`` (a ``sources.Model``) takes; ``generative``: the module
        that times its generation, or None."""
        self.operator, self.generative = model.operator, generative
        self.inputs, self.params, self.entry, self.is_vm = model.inputs, model.params, model.entry, model.is_vm
        self.out_array, self.out_shape = model.out, model.out_shape

    def _build(self, spec: dict):
        """Build ``spec``'s model, compile it (or load the library an earlier worker compiled)
        and keep what one call takes; the library and the device module (None on the CPU)."""
        tvm = self.tvm
        rng = np.random.default_rng(spec.get("seed", 0))
        # a dict, or the string of a target an earlier worker resolved (a counted worker under
        # Valgrind would otherwise resolve "native" to Valgrind's own CPU model)
        target_spec = dict(spec["target"]) if isinstance(spec["target"], dict) else spec["target"]
        if isinstance(target_spec, dict) and target_spec.get("mcpu") == "native":  # the host's CPU, as this TVM's LLVM names it
            from tvm.target import codegen

            target_spec["mcpu"] = codegen.llvm_get_system_cpu()
        on_device = _sibling("device") if spec["device"] != "cpu" and not spec.get("rpc") else None
        if on_device is not None:  # a GPU's backend and driver: named when missing, before any compile
            on_device.check(tvm, spec["device"], need_device=not spec.get("compile_only"))
        target = tvm.target.Target(target_spec)
        self.target = str(target)
        kind, sources = spec["model"].partition(":")[0], _sibling("sources").SOURCES
        if kind not in sources:
            raise ValueError(f"unknown model kind {kind!r}")
        source = sources[kind](_sibling)  # builtin, te, onnx, script: sources.py
        load, export = spec.get("load"), spec.get("export")
        model = source.build(spec, rng, target)
        self.reports = source.reports(model)
        self._take(model, model.generative)
        if spec.get("save"):  # for forked children that load it rather than build (saved.py)
            generative = model.generative.__name__.removeprefix("abwatch_") if model.generative else None
            try:
                _sibling("saved").save(spec["save"], model, generative)
            except Exception as exc:  # noqa: BLE001 - inputs numpy cannot save: children build them as before
                print(f"inputs not saved for forked children: {type(exc).__name__}: {exc}", file=sys.stderr)
        mod = model.mod
        # the device's output is checked against this build's CPU output of the module before
        # any GPU schedule (a script that scheduled its kernels itself is checked against the
        # other side's output only, as every workload is)
        cpu_module = mod
        if on_device is not None and not self.is_vm:
            mod = on_device.schedule(tvm, mod, target)
        self.reference = ((cpu_module, on_device) if on_device is not None and not load
                          and (self.is_vm or mod is not cpu_module) else None)
        start = time.perf_counter()
        self.region = _region(spec["count"]) if spec.get("count") else None
        if load:  # compiled by this build's first worker: every later process just loads it
            lib = tvm.runtime.load_module(load)
        elif self.region is not None and spec.get("compile_only"):  # the compiler's instructions
            self.region.start()
            lib = tvm.compile(mod, target=target)
            self.instructions = self.region.stop()
            self.compile_ms = (time.perf_counter() - start) * 1000.0
        else:
            lib = tvm.compile(mod, target=target)
            self.compile_ms = (time.perf_counter() - start) * 1000.0
            if export:
                lib.export_library(export)
        return lib, on_device

    def callable(self, vm, dev):
        """What one call of the workload is on the Relax VM ``vm`` of device ``dev``: its entry
        function, or a whole generation (prefill and decode steps) of a model that generates tokens."""
        return self.generative.Generation(vm, dev) if self.generative is not None else vm[self.entry]

    def _upload(self, lib, path: str | None):
        """Send the compiled library to a board through the tracker and load it there (a Relax
        model's kernels too, for per-operator times: :class:`ops.Board`)."""
        from tvm import rpc

        host, port = self.spec["rpc"]["tracker"].rsplit(":", 1)
        tracker = rpc.connect_tracker(host, int(port))
        remote = tracker.request(self.spec["rpc"]["key"], priority=1, session_timeout=0)
        self.remote, self.board = remote, None
        with tempfile.TemporaryDirectory() as tmp:
            if path is None:  # not exported yet: export it here
                path = os.path.join(tmp, "workload.so")
                lib.export_library(path)
            remote.upload(path, target="workload.so")
            if self.is_vm:
                self.board = _sibling("ops").Board.attach(
                    remote, lib, path, self.entry, self.inputs + list(self.params), self.spec.get("seed", 0))
        return remote.load_module("workload.so")

    def run(self) -> dict:
        """One timing batch: ``repeat`` samples of ``number`` calls each, and per-op times."""
        usage_of = _sibling("usage")
        timer = self._batch_timer()
        before = usage_of.start()
        cpu_samples = None
        if timer is None:  # a model that generates: one generation a sample, and its figures (ttft, ...)
            samples, series, cpu_samples = self.call.time(self.args, self.spec["repeat"])
        else:
            if self.clock is not None:
                self.clock.begin()
            samples, series = [t * 1000.0 for t in timer(*self.args).results], None
        usage = usage_of.figures(*before) if self.spec["device"] == "cpu" and not self.spec.get("rpc") else None
        if usage is not None and self.clock is not None and timer is not None and timer is self.marked:
            cpu_samples = self.clock.samples_ms(len(samples))
        if usage is not None and cpu_samples is not None:
            usage["cpu_samples"] = cpu_samples
        if not self.is_vm:  # a single operator: the whole call is the operator
            name = self.operator
            return {"samples": samples, "ops": {name: float(np.median(samples)) * 1000},
                    "op_features": {name: _sibling("ops").features(self.args)}, "usage": usage}
        features: dict = {}
        return {"samples": samples, "ops": self._ops(features), "op_features": features, "usage": usage,
                **({"series": series} if series else {})}

    def count_run(self) -> dict:
        """The instructions of ``number`` calls (one timed sample's worth), counted."""
        if self.region is None:
            raise RuntimeError("this worker was not started to count instructions")
        number = int(self.spec["number"])
        self.call(*self.args)  # the first call of a process is not timed either (lazy set-up)
        self.region.start()
        for _ in range(number):
            self.call(*self.args)
        self.dev.sync()
        return {"instructions": self.region.stop(), "calls": number}

    def _ops(self, features: dict) -> dict:
        """Per-operator time (µs) of one call; ``features`` gets each operator's argument shapes
        and dtypes. On this process's device, the VM's instrument hook, synced (a GPU's too); on
        a board, which the hook cannot reach, each kernel timed there (ops.py says why)."""
        if self.remote is None:
            return _sibling("ops").instrumented(self.vm, self.call, self.args, self.dev, features)
        return self.board.times(self.dev, features) if self.board is not None else {}

    def outputs(self) -> dict:
        """The first output on the seeded inputs, for the error comparison."""
        result = self.call(*self.args) if self.is_vm else (self.call(*self.args), self.out)[1]
        while not hasattr(result, "numpy"):  # tuples of outputs: take the first
            result = result[0]
        array = result.numpy().astype(np.float32)
        reply = {"shape": list(array.shape), "dtype": "float32", "data": base64.b64encode(array.tobytes()).decode()}
        if self.reference is not None:  # a kernel that computes the wrong thing fast is a failure
            mod, on_device = self.reference
            error = on_device.reference_error(on_device.cpu_output(self, mod), array)
            if not error["ok"]:
                why = error.get("why") or f"max abs error {error['max_abs_error']:g}"
                raise RuntimeError(f"the {self.spec['device']} output differs from this build's CPU output: {why}")
            reply["reference"] = error
        return reply


def serve(spec: dict, send) -> int:
    """Compile ``spec``'s workload, say so, and serve its commands until told to exit or stdin
    closes; the exit status."""
    if spec.get("cpus"):  # a duet's forked child: on its side's CPU before it loads or touches anything
        os.sched_setaffinity(0, spec["cpus"])
    try:
        workload = Workload(spec)
    except _sibling("script").ScriptError as exc:  # the user's file and line, not this worker's traceback
        send({"error": f"script workload failed: {exc}"})
        return 1
    except Exception as exc:  # noqa: BLE001 - any compile failure is reported, not raised
        send({"error": f"compile failed: {type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-4000:]})
        return 1
    import tvm

    send({"ready": True, "compile_ms": workload.compile_ms, "tvm_version": tvm.__version__,
          "target": workload.target,
          "features": {name: bool(tvm.runtime.enabled(name)) for name in ("llvm", "cuda", "rpc", spec["device"])},
          **({"device": workload.device} if workload.device else {}),
          "input_shapes": [list(x.shape) for x in workload.inputs],
          "num_threads": os.environ.get("TVM_NUM_THREADS"),
          **({"instructions": workload.instructions} if workload.instructions else {}),
          **workload.reports,  # what the model's source says of it (a script's SHA-256)
          # a compile-only worker's peak is its compile's (the import's included, alike on both sides)
          **({"max_rss_kb": _sibling("usage").peak_kb()} if spec.get("compile_only") else {})})
    for line in sys.stdin:
        command = json.loads(line).get("cmd")
        try:
            if command == "run":
                send(workload.run())
            elif command == "outputs":
                send(workload.outputs())
            elif command == "count_run":
                send(workload.count_run())
            elif command == "exit":
                return 0
            else:
                send({"error": f"unknown command {command!r}"})
        except Exception as exc:  # noqa: BLE001 - report and keep serving
            send({"error": f"{command} failed: {type(exc).__name__}: {exc}"})
    return 0


def fork_server(out, send, timed: bool = False) -> int:
    """Import TVM once, then fork a fresh worker per ``{"cmd": "fork"}``: the child says so,
    reads its spec and serves it (:func:`serve`) on the same stdin/stdout, and exits; the
    parent, which reads nothing while a child lives, then says how it ended. Counted workers
    start this way, so Valgrind runs ``import tvm`` once per build rather than once per count;
    so do timed workers (``timed``), whose start is then a fork rather than an interpreter's
    start and ``import tvm`` (about 0.55 s of a 0.9 s invocation of builtin:mlp)."""
    import tvm

    # Started with TVM_USE_RUNTIME_LIB=1, TVM loads its runtime library alone: the server of
    # children given their saved inputs (saved.py), which never need the compiler.
    runtime_only = os.environ.get("TVM_USE_RUNTIME_LIB") == "1"
    if not runtime_only:
        from tvm import relax  # noqa: F401 - what every workload imports, imported before the forks
    if timed:
        # what a timed child would import or load next, imported once here; a counted child
        # counts only a region, and its server keeps to the import its counts always had
        from tvm.runtime import vm  # noqa: F401

        if not runtime_only:
            from tvm.relax.frontend import nn  # noqa: F401
        for sibling in ("sources", "saved", "ops", "usage", *(() if runtime_only else ("builtin_models",))):
            _sibling(sibling)
    fork_line, exit_line = (json.dumps({"cmd": cmd}).encode() + b"\n" for cmd in ("fork", "exit"))
    first = _fork(out, send, warm_up=True)  # the loop below, once, before any counted child
    send({"forking": True, "tvm_version": tvm.__version__, "warm_up": first, "libraries": _tvm_libraries()})
    while True:
        # Every child starts from the same state of this process, whatever came before: the
        # same few bytes read the same way (the spec goes to the child), nothing left to
        # collect, and all that is here frozen out of the child's collections.
        line = _read_line()
        if line != fork_line:
            if line not in (b"", exit_line):
                send({"error": f"a fork server forks; unknown request {line[:80]!r}"})
                continue
            return 0
        send({"forked": True, "status": _fork(out, send, shift=timed)})


def _tvm_libraries() -> list[str]:
    """The file names of the TVM libraries this process has mapped (``libtvm_runtime.so``,
    and the compiler's where it was loaded)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    except OSError:  # no procfs: nothing to say
        return []
    return sorted({os.path.basename(p) for p in paths if os.path.basename(p).startswith("libtvm")})


def _read_line() -> bytes:
    """One line of stdin, read a byte at a time from the descriptor: no buffer for a child to
    inherit, and the same allocations for the same line every time."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return line
        line += byte
    return line


def _fork(out, send, warm_up: bool = False, shift: bool = False) -> int:
    """Fork a child that serves one spec read from stdin (or, warming up, exits at once); its
    exit status once it has ended. ``shift``: the child moves its stack and heap by a random
    amount first (:func:`_shifted`)."""
    gc.collect()
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # the child: a worker of its own, never back into the server's loop
        code = 1
        try:
            if warm_up:
                code = 0
            elif shift:
                code = _shifted(lambda layout: send({"child": os.getpid(), "layout": layout}) or
                                serve(json.loads(_read_line()), send))
            else:
                send({"child": os.getpid()})
                code = serve(json.loads(_read_line()), send)
        finally:
            out.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


# A forked child shares its server's memory layout, and one layout can be worth a few percent
# (Mytkowicz et al., ASPLOS 2009: stack alignment by environment size, link order). So each timed
# child draws its own: its heap moved by a live allocation of 0-64 KiB (16-byte steps, malloc's
# granularity; below its mmap threshold, so it moves the heap the workload's buffers and
# tensors are then taken from) and its stack by 0-63 levels of calls entered from C (each a
# frame of the C stack: a Python call from Python takes none in CPython 3.11+). The server's
# own stack start moves with its environment's size, drawn afresh at each server's start
# (runners/fork_servers.py), so servers differ byte by byte and children by frames.
MAX_HEAP_SHIFT, MAX_STACK_DEPTH = 64 * 1024, 64


def _shifted(serve_in):
    """``serve_in(layout)``'s result, called with the heap and stack moved by a random amount,
    ``layout`` saying by how much."""
    draw = int.from_bytes(os.urandom(4), "little")  # not random's state, which every child inherits
    heap_bytes = (draw % (MAX_HEAP_SHIFT // 16)) * 16
    depth = (draw // (MAX_HEAP_SHIFT // 16)) % MAX_STACK_DEPTH
    held = bytearray(heap_bytes)  # kept alive below: the allocation must outlive the workload's
    layout = {"stack_depth": depth, "heap_bytes": heap_bytes}

    def deeper(level: int):
        if level == 0:
            return serve_in(layout)
        return next(map(deeper, (level - 1,)))  # map calls deeper from C: one more C frame

    code = deeper(depth)
    del held
    return code


def main() -> int:
    """Serve one workload (or, given ``{"fork": true}``, fork workers) until told to exit or
    stdin closes."""
    out = _protocol_stream()

    def send(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")

    spec = json.loads(sys.stdin.readline())
    return fork_server(out, send, bool(spec.get("timed"))) if spec.get("fork") else serve(spec, send)


if __name__ == "__main__":
    sys.exit(main())
