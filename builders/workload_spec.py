"""The config models of the built-in workload kinds, and the base every workload model shares.

A workload's section of the config (``[[workloads]]``) is validated by the model its kind
names: :class:`CommandWorkloadConfig`, :class:`TvmWorkloadConfig`, or a new kind's own
subclass of :class:`WorkloadSpec`. The kind -> model mapping lives in one place, the
registry of workload kinds (:data:`abwatch.runners.workloads.WORKLOAD_KINDS`), which also
says how each kind runs, resolves its paths, which runners take it and how its outputs are
checked. The models sit here, at the bottom of the layers, because the runners' TVM sessions
read them too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from abwatch.core.sides import TREATMENT
from abwatch.core.metric_names import FROM_TIMED_PROCESSES, GENERATION, OF_BUILDS, OF_WORKLOADS, Metric
from abwatch.core.config_base import StrictModel
from abwatch.builders.spec import Threads
from abwatch.core.plugins import Registry

# What one invocation of a command workload may print and report, unless its config says more.
MAX_OUTPUT_MB = 16
MAX_SAMPLES = 100_000


# What a workload may be measured by (``measure``): wall time, the instructions a process
# retires (runners/counters.py), which barely move with load, and what the timed processes used
# (CPU time, peak memory). The first listed decides the comparison's verdict; each has its own
# verdict and threshold (service.compare.metrics).
def _measure_field():
    return Field(default_factory=lambda: [Metric.TIME], min_length=1,
                 description='metrics measured, of ' + ", ".join(m.value for m in OF_WORKLOADS) + ': e.g. ["time"], '
                             '["time", "instructions", "max_rss"] or ["instructions"]; the first decides the '
                             "comparison's verdict (time or instructions)")


def _unique(value: list[Metric]) -> list[Metric]:
    names = [m.value for m in value]
    if len(set(names)) != len(names):
        raise ValueError(f"lists a metric twice: {names}")
    if any(m in OF_BUILDS for m in value):  # every build is measured so, whatever the workloads say
        raise ValueError(f"{', '.join(m.value for m in value if m in OF_BUILDS)} is a metric of the build, not "
                         "of a workload: each run judges it between its two builds by itself")
    if value[0] in FROM_TIMED_PROCESSES:
        raise ValueError(f"{value[0].value} is judged from the timed processes and cannot decide the "
                         f'comparison: list "time" (or "instructions") first, e.g. ["time", "{value[0].value}"]')
    if any(m in FROM_TIMED_PROCESSES for m in value) and Metric.TIME not in value:
        raise ValueError(f'{", ".join(m.value for m in value if m in FROM_TIMED_PROCESSES)} is judged from the '
                         'timed processes: add "time" to measure')
    return value


class WorkloadSpec(StrictModel):
    """What every workload has, whatever its kind: a name, its kind, a time limit per
    invocation, and the metrics it is measured by. Each kind's model subclasses it and
    narrows ``kind`` to its own name (``Literal["command"]``)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\-]+$")
    kind: str
    timeout_s: float | None = Field(default=None, gt=0)
    measure: list[Metric] = _measure_field()
    memory_bound: bool = Field(
        default=False, description="its time goes to memory traffic: measured interleaved even under "
        '[run] schedule = "duet", whose two sides at once would share the memory bandwidth and shrink a difference '
        "(docs/statistics.md, \"Duet runs\")")

    _unique_metrics = field_validator("measure")(_unique)

    def generates_tokens(self) -> bool:
        """Whether its processes generate tokens, and so report the generation's metrics
        (:data:`~abwatch.core.metric_names.GENERATION`): a built-in LLM's (``builtin:llm-decode``)."""
        return False

    @model_validator(mode="after")
    def _generation_metrics_need_a_generation(self) -> WorkloadSpec:
        listed = [m.value for m in self.measure if m in GENERATION]
        if listed and not self.generates_tokens():
            raise ValueError(f"measure: {', '.join(listed)} is reported by a workload that generates tokens "
                             f"({', '.join(GENERATIVE_MODELS)}), not by this one")
        return self


class CommandWorkloadConfig(WorkloadSpec):
    """A workload run as a command, by default inside the build's artifact directory.

    Each invocation prints one JSON object per line with ``runtime_ms`` (or a whole
    TVM v0.1 record whose ``runtime_raw`` holds the samples). On a ``tvm-wheel`` or
    ``tvm-source`` build the command runs with that build's Python first on ``PATH`` and its
    variables set (``builders/environment.py``), so ``["python", "bench.py"]`` uses that build.
    """

    kind: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list, description="names of abwatch's own environment variables passed to the "
        "workload (read when it runs, never stored); nothing else of that environment is passed")
    cwd: str | None = Field(default=None, description="directory the command runs in (relative to the "
                            "config file); default: the build's artifact directory")
    # None: the defaults below. A workload printing without bound once filled 2 GB of memory
    # and a 400 MB database from one small compare; past either limit the invocation is an error.
    max_output_mb: float | None = Field(default=None, gt=0, le=4096,
                                        description=f"output an invocation may print (default {MAX_OUTPUT_MB} MB)")
    max_samples: int | None = Field(default=None, ge=1,
                                    description=f"samples an invocation may report (default {MAX_SAMPLES})")

    @property
    def output_limit(self) -> int:
        """Bytes of stdout (and, apart, of stderr) one invocation may print."""
        return int((self.max_output_mb or MAX_OUTPUT_MB) * 2**20)

    @property
    def samples_limit(self) -> int:
        """Samples one invocation may report."""
        return self.max_samples or MAX_SAMPLES


@dataclass(frozen=True)
class ModelSource:
    """A source of TVM models, as a config writes it before the model's colon (``builtin:mlp``,
    ``onnx:<path>``); the worker's class of the same name builds them (its ``SOURCES``,
    ``runners/worker/sources.py``, which cannot import this: it runs in a build's Python).

    ``models``: the models it names, each with the ``options`` keys it reads (any other key is
    an error); None where what follows the colon is a path, whose models read ``options``
    (none for onnx:) or, where that is None, the user's own keys (a script's, passed to its
    function as keywords). ``md5``: a path's md5 must be given.
    """

    models: dict[str, tuple[str, ...]] | None = None
    options: tuple[str, ...] | None = ()
    md5: bool = False

    def written(self, source: str) -> list[str]:
        """Its models as a config writes them: ``builtin:mlp``, ..., or ``onnx:<path>``."""
        return [f"{source}:{name}" for name in sorted(self.models)] if self.models is not None else [f"{source}:<path>"]


# The names a config may write before a TVM model's colon: the one list on the host side.
MODEL_SOURCES: Registry[ModelSource] = Registry("model source", [
    ("builtin", ModelSource(models={  # runners/worker/builtin_models.py, llm.py
        "mlp": ("hidden", "classes", "weight_scale"),
        "cnn": ("classes", "weight_scale"),
        "resnet18": ("classes", "weight_scale"),
        "transformer": ("heads", "weight_scale"),
        "llm-decode": ("layers", "hidden", "heads", "prompt_tokens", "decode_steps", "vocab", "weight_scale"),
    })),
    ("te", ModelSource(models={"matmul": ("m", "k", "n"), "conv2d": ("out_channels", "kernel")})),
    ("onnx", ModelSource(options=(), md5=True)),
    ("script", ModelSource(options=None)),
])
# Built-in models that generate tokens: a prefill, then decode steps (runners/worker/llm.py); by
# default measured by time (one whole generation a sample) and the generation's metrics.
GENERATIVE_MODELS = ("builtin:llm-decode",)
SCRIPT_REPO = "script:repo:"  # a script read from the build's own source tree (tvm-source ``keep``)
# What ``treatment_options`` may override for the treatment side.
TREATMENT_OVERRIDES = ("options", "dtype", "input_shape")


class TvmWorkloadConfig(WorkloadSpec):
    """A TVM model compiled once per build and timed by the harness worker in that build.

    ``model``: ``builtin:<mlp|cnn|resnet18|transformer|llm-decode>``, ``te:<matmul|conv2d>``,
    ``onnx:<path>`` (with ``md5``) or ``script:<path>``: a Python file defining
    ``workload(**options)`` that returns an ``IRModule`` or ``(IRModule, inputs)``
    (``script:repo:<path>`` reads it from the build's source tree; see docs/workloads.md).
    A ``script:<path>``'s SHA-256 (``script_sha256``, filled in when the config is read) is
    part of the workload's identity: a changed script starts a new series. ``treatment_options``
    apply to the treatment side only (``{dtype = "float16"}``, ``{options = {hidden = 640}}``,
    ``{input_shape = [33, 256]}``), to study or provoke a difference on purpose; only the keys in :data:`TREATMENT_OVERRIDES` and each model's options
    (:data:`MODEL_SOURCES`) are accepted.
    """

    kind: Literal["tvm"] = "tvm"
    model: str = Field(pattern=r"^[^:]+:.+")  # <source>:<model>, the source one of MODEL_SOURCES
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    script_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                      description="script: models: the file's SHA-256 (default: read from it)")
    input_shape: list[int] | None = None
    dtype: str = "float32"
    options: dict[str, Any] = Field(default_factory=dict)
    treatment_options: dict[str, Any] = Field(default_factory=dict)
    # One call a sample, many samples: a fresh process's fastest sample is what it is judged
    # by, and on a shared machine only a sample shorter than a scheduler time slice has a
    # chance to run uninterrupted. Measured on the MLP under load 7-9 on 2 cores: the spread of
    # processes' fastest samples was 21-35 % with 5 calls x 5 samples, 4.3-5.8 % with 1 x 50-200
    # (docs/statistics.md); 100 samples cost ~0.2 s of a ~4.5 s process.
    number: int = Field(default=1, ge=1, description="calls per sample (time_evaluator number)")
    samples: int = Field(default=100, ge=1, description="samples per batch (time_evaluator repeat)")
    rtol: float = Field(default=1e-4, ge=0)
    atol: float = Field(default=1e-5, ge=0)
    # set, part of the series (a workload timed on four threads is another measurement than on
    # one); unset, the runner's threads are not (a changed default steps the series)
    threads: Threads | None = Field(
        default=None, description='TVM_NUM_THREADS of its measured processes: a number, or "all" (every core); '
        "default: the runner's (1 on this host's CPU). On several threads a verdict under heavy contention "
        "is refused: their CPU time waiting inflates too")
    # how its forked processes are served, never part of the series: unset, the runner's
    # children_per_server, or what the noise history chose (service/compare/noise.py)
    children_per_server: int | None = Field(
        default=None, ge=1, le=1000, description='[runner] processes = "forked": children a fork server serves '
        "before it is restarted, for this workload (default: what its noise history chose, else the runner's)")
    # measure = [..., "instructions"] counts the compile call's and the timed calls' (on the
    # local CPU; GPU and RPC runs keep wall time and say so), each in its own fresh worker process

    @field_validator("treatment_options")
    @classmethod
    def _known_overrides(cls, value: dict[str, Any]) -> dict[str, Any]:
        # A key the worker does not read would turn the run into a silent A/A comparison.
        for key in value:
            if key not in TREATMENT_OVERRIDES:
                raise ValueError(f"unknown key {key!r} (the treatment may override: "
                                 f"{', '.join(TREATMENT_OVERRIDES)}; model options go in options = {{...}})")
        if not isinstance(value.get("options", {}), dict):
            raise ValueError("options: expected a table of model options")
        if not isinstance(value.get("dtype", ""), str):
            raise ValueError("dtype: expected a string such as \"float16\"")
        shape = value.get("input_shape")
        if "input_shape" in value and not (isinstance(shape, list) and shape
                                           and all(type(n) is int and n > 0 for n in shape)):
            raise ValueError(f"input_shape: expected a list of positive integers such as [33, 256], not {shape!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _generation_measured(cls, data: Any) -> Any:
        # a model that generates tokens reports what mlc-llm's benchmark does unless told otherwise
        if isinstance(data, dict) and data.get("model") in GENERATIVE_MODELS and "measure" not in data:
            return {**data, "measure": [Metric.TIME, *GENERATION]}
        return data

    def generates_tokens(self) -> bool:
        return self.model in GENERATIVE_MODELS

    def overrides(self, side: str) -> dict[str, Any]:
        """What ``side`` changes of the workload: ``treatment_options`` for the treatment, nothing
        for the control (the TVM worker merges them over the workload's own settings)."""
        return self.treatment_options if side == TREATMENT else {}

    @model_validator(mode="after")
    def _known_model(self) -> TvmWorkloadConfig:
        prefix, _, name = self.model.partition(":")
        source = MODEL_SOURCES.get(prefix, None)
        if source is not None and source.md5 and self.md5 is None:
            raise ValueError(f"{'an' if prefix[0] in 'aeiou' else 'a'} {prefix}: model needs its md5")
        if source is not None and source.models is None and source.options is None:  # the user's own options
            return self
        if self.model in GENERATIVE_MODELS and (self.input_shape or self.treatment_options.get("input_shape")):
            raise ValueError(f"input_shape: {self.model} takes its shapes from its options "
                             "(prompt_tokens, hidden, ...), not from input_shape")
        known = (None if source is None else source.options if source.models is None
                 else source.models.get(name))
        if source is None or known is None:
            # the named models first, then the sources of paths, each as a config writes it
            names = [model for written, entry in sorted(MODEL_SOURCES.items(), key=lambda item: item[1].models is None)
                     for model in entry.written(written)]
            close = difflib.get_close_matches(self.model, names, n=1, cutoff=0.6)
            raise ValueError(f"model: unknown model {self.model!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                             + f" (known: {', '.join(names)})")
        for where, options in (("options", self.options),
                               ("treatment_options.options", self.treatment_options.get("options", {}))):
            for key in options:
                if key not in known:
                    model = self.model if source.models is not None else f"{prefix} models"
                    raise ValueError(f"{where}: unknown key {key!r} for {model} (known: {', '.join(known) or 'none'})")
        return self
