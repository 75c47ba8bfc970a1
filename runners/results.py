"""What a runner yields: each invocation's result and the metrics a TVM worker reports (its
device's description is :class:`abwatch.core.device_identity.DeviceInfo`).

Apart from :mod:`.base` (the runner interface) so that the modules a runner is made of
(the harness, the workload kinds, the TVM sessions) and the service can all use these types
while :mod:`.base` imports those modules in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class OpFeatures(TypedDict):
    """Shapes and dtypes of an operator's tensor arguments (inputs first, then outputs)."""

    shapes: list[list[int]]
    dtypes: list[str]


class WorkerReady(TypedDict, total=False):
    """What a TVM worker says of itself once its workload is compiled (``runners/worker/tvm_worker.py``)."""

    ready: bool
    compile_ms: float
    tvm_version: str
    target: Any  # the TVM target as the worker printed it
    features: dict[str, bool]  # llvm, cuda, rpc enabled in that TVM
    input_shapes: list[list[int]]
    num_threads: str | None  # $TVM_NUM_THREADS as the worker saw it


class OutputTensor(TypedDict):
    """A workload's first output, as the worker sends it."""

    shape: list[int]
    dtype: str
    data: str  # base64 of the raw bytes


class TvmMetrics(TypedDict, total=False):
    """What one TVM invocation reports beside its samples: per-operator times (µs) and their
    features; the invocation that compiled also its compile time, its worker's self-description,
    its output and the size of the library it exported."""

    ops: dict[str, float]
    op_features: dict[str, OpFeatures]
    compile_ms: float
    ready: WorkerReady
    outputs: OutputTensor
    code: dict[str, int | None]  # the compiling invocation's library: runners.code_size.CodeSize


@dataclass(frozen=True)
class InvocationResult:
    """One workload process: its status, its samples (ms) and what it said on failure."""

    status: str  # "ok" | "timeout" | "error" (values of service.store.models.InvocationStatus)
    samples: tuple[float, ...]
    wall_s: float
    message: str = ""
    records: tuple[dict, ...] = field(default_factory=tuple)
    metrics: TvmMetrics = field(default_factory=lambda: TvmMetrics())  # TVM workloads only
    # how contended the process was: CPU seconds it used, and how often the kernel took the CPU
    # from it, over ``usage_wall_s`` seconds of wall time (command workloads: the whole process,
    # from wait4; TVM workers: the timing batch, all ``threads``); None where not measured
    cpu_s: float | None = None
    involuntary_switches: int | None = None
    usage_wall_s: float | None = None  # None: the whole invocation (wall_s)
    threads: int = 1  # threads the measured code ran on (TVM_NUM_THREADS)
    # peak resident memory (KiB) of the process (command workloads, from wait4) or of the timed
    # region (TVM workers: the peak reset before the timing batch), or of the compile (a TVM
    # worker that only compiles); None where not measured
    max_rss_kb: int | None = None
    # a process that generated tokens: each generation's figures by metric name (ttft,
    # decode_latency, tokens_per_s: builtin:llm-decode), one value per sample
    series: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # a counted process: the functions its count was spent in (runners.profiles.Profile.to_dict,
    # per call where its sample is), None where the counter counts no functions
    profile: dict[str, Any] | None = None
    # a forked TVM worker ([runner] processes = "forked"): the fork server it was a child of, by
    # its number in the runner's sequence of servers (a level of the statistics above the
    # process: its children share its memory layout), and its process id as it saw it; None
    # for a fresh process
    server: int | None = None
    pid: int | None = None
    # a server's first child: how long its server took to start (seconds, its interpreter and
    # ``import tvm``), whether the child waited for it or it was started ahead; None otherwise
    server_start_s: float | None = None
    # each sample's own CPU time (ms), where the worker marked them (TVM workers on the host
    # CPU: runners/worker/usage.py); empty where not measured
    cpu_samples: tuple[float, ...] = ()
    # a TVM worker's timing batch on the host CPU: when it began (``time.monotonic()``, a clock
    # every process of the host shares) and the CPUs it could run on (a duet's side: its own);
    # None where not measured
    began: float | None = None
    cpus: tuple[int, ...] | None = None

    @property
    def usage_span_s(self) -> float:
        """The wall time the CPU figures cover: the timing batch's where reported, else the
        whole invocation's."""
        return self.usage_wall_s or self.wall_s
