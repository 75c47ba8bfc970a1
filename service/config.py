"""The one typed, validated configuration object of abwatch.

A config is a TOML file (see ``config/example.toml``). :func:`load_config` parses
and validates it into :class:`Config`; every error names the file and the key at
fault, e.g. ``abwatch.toml: build.command: field required``. The object is passed
explicitly to the layers that need it; nothing reads global state.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator,
)

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "abwatch"


class ConfigError(Exception):
    """A configuration file that cannot be read or does not validate."""


class _Strict(BaseModel):
    """Base for config sections: unknown keys are errors (they are usually typos)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RepoConfig(_Strict):
    """The git repository under watch."""

    url: str = Field(min_length=1)
    branch: str = "main"


class CommandBuildConfig(_Strict):
    """Build by running a command in a clean checkout of the commit."""

    kind: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)
    artifacts: str = "."
    timeout_s: float = Field(default=1800.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("artifacts")
    @classmethod
    def _relative(cls, value: str) -> str:
        if Path(value).is_absolute() or ".." in Path(value).parts:
            raise ValueError("must be a path inside the checkout")
        return value

    def config_hash(self) -> str:
        """Hash of everything that changes what a build produces (the cache key part)."""
        payload = self.model_dump(exclude={"timeout_s"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class TvmWheelBuildConfig(_Strict):
    """Install a released apache-tvm wheel (refs are versions, e.g. ``0.27.0.post1``) into a venv."""

    kind: Literal["tvm-wheel"] = "tvm-wheel"
    packages: list[str] = Field(default_factory=list, description="more pip requirements, e.g. onnx")
    timeout_s: float = Field(default=900.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="added to the allow-listed environment")

    def config_hash(self) -> str:
        """Hash of what changes the venv (the cache key part besides the version)."""
        payload = {"kind": self.kind, "packages": sorted(self.packages)}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class TvmSourceBuildConfig(_Strict):
    """Build TVM from source at a commit with CMake + Ninja (+ ccache), incrementally.

    ``cmake`` entries become ``set(KEY VALUE)`` lines of ``config.cmake`` (``USE_LLVM``,
    ``USE_CUDA``, ...). ``submodule_rewrites`` maps URL prefixes to mirrors (git's
    ``url.<mirror>.insteadOf <prefix>``). ``python_packages`` go into the artifact's venv;
    ``{ffi_version}`` is replaced by the tag of the ``3rdparty/tvm-ffi`` submodule.
    """

    kind: Literal["tvm-source"] = "tvm-source"
    cmake: dict[str, str] = Field(default_factory=lambda: {"USE_LLVM": "ON"})
    runtime_only: bool = False
    targets: list[str] = Field(default_factory=list, description="default: all, or the runtime only")
    libraries: list[str] = Field(default_factory=lambda: ["*.so", "lib/*.so"],
                                 description="globs in the build directory kept as lib/")
    python_dir: str = "python"
    python_packages: list[str] = Field(
        default_factory=lambda: ["numpy", "apache-tvm-ffi=={ffi_version}", "tornado", "psutil", "cloudpickle"])
    submodule_rewrites: dict[str, str] = Field(default_factory=dict)
    submodules: list[str] | None = Field(
        default=None, description="submodule paths to check out (recursively); default: all")
    jobs: int | None = Field(default=None, ge=1)
    cache_limit_gb: float = Field(default=20.0, gt=0)
    pack_deltas: bool = Field(default=True, description="keep older builds' large files as binary deltas")
    timeout_s: float = Field(default=7200.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="added to the allow-listed environment")

    def config_hash(self) -> str:
        """Hash of what changes the artifact (not limits, mirrors, parallelism or packing)."""
        payload = self.model_dump(exclude={"submodule_rewrites", "submodules", "jobs", "cache_limit_gb",
                                           "timeout_s", "pack_deltas"})
        if not payload["env"]:  # keeps the keys of builds made before `env` existed
            del payload["env"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def workspace_hash(self) -> str:
        """Hash of what changes the compiled output: configurations that share it share a build dir."""
        payload = self.model_dump(include={"cmake", "runtime_only", "targets"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


BUILD_KINDS = ("command", "tvm-wheel", "tvm-source")
WORKLOAD_KINDS = ("command", "tvm")


def _kind_of(default: str, kinds: tuple[str, ...]):
    """Discriminator that treats a missing ``kind`` as ``default`` (old configs stay valid)."""

    def pick(value: Any) -> str:
        if isinstance(value, dict):
            return value.get("kind", default)
        return getattr(value, "kind", default)

    expected = ", ".join(repr(k) for k in kinds)
    return Discriminator(pick, custom_error_type="unknown_kind",
                         custom_error_message=f"unknown kind; expected one of {expected}")


BuildConfig = Annotated[
    Union[Annotated[CommandBuildConfig, Tag("command")], Annotated[TvmWheelBuildConfig, Tag("tvm-wheel")],
          Annotated[TvmSourceBuildConfig, Tag("tvm-source")]],
    _kind_of("command", BUILD_KINDS),
]


class CommandWorkloadConfig(_Strict):
    """A workload run as a command inside the build's artifact directory.

    Each invocation prints one JSON object per line with ``runtime_ms`` (or a whole
    TVM v0.1 record whose ``runtime_raw`` holds the samples).
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\-]+$")
    kind: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default_factory=list, description="names of abwatch's own environment variables passed to the "
        "workload (read when it runs, never stored); nothing else of that environment is passed")
    timeout_s: float | None = Field(default=None, gt=0)


# What each model reads from ``options`` (runners/tvm_worker.py); any other key is an error.
MODEL_OPTIONS: dict[str, tuple[str, ...]] = {
    "builtin:mlp": ("hidden", "classes", "weight_scale"),
    "builtin:cnn": ("classes", "weight_scale"),
    "builtin:resnet18": ("classes", "weight_scale"),
    "builtin:transformer": ("heads", "weight_scale"),
    "te:matmul": ("m", "k", "n"),
    "te:conv2d": ("out_channels", "kernel"),
    "onnx": (),
}
# What ``treatment_options`` may override for the treatment side.
TREATMENT_OVERRIDES = ("options", "dtype")


class TvmWorkloadConfig(_Strict):
    """A TVM model compiled once per build and timed by the harness worker in that build.

    ``model``: ``builtin:<mlp|cnn|resnet18|transformer>``, ``te:<matmul|conv2d>`` or
    ``onnx:<path>`` (with ``md5``). ``treatment_options`` apply to the treatment side only
    (``{dtype = "float16"}``, ``{options = {hidden = 640}}``), to study or provoke a difference
    on purpose; only the keys in :data:`TREATMENT_OVERRIDES` and each model's
    :data:`MODEL_OPTIONS` are accepted.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:\-]+$")
    kind: Literal["tvm"] = "tvm"
    model: str = Field(pattern=r"^(builtin|te|onnx):.+")
    md5: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    input_shape: list[int] | None = None
    dtype: str = "float32"
    options: dict[str, Any] = Field(default_factory=dict)
    treatment_options: dict[str, Any] = Field(default_factory=dict)
    number: int = Field(default=5, ge=1, description="calls per sample (time_evaluator number)")
    samples: int = Field(default=5, ge=1, description="samples per batch (time_evaluator repeat)")
    rtol: float = Field(default=1e-4, ge=0)
    atol: float = Field(default=1e-5, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)

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
        return value

    @model_validator(mode="after")
    def _onnx_needs_md5(self) -> "TvmWorkloadConfig":
        if self.model.startswith("onnx:") and self.md5 is None:
            raise ValueError("an onnx: model needs its md5")
        known = MODEL_OPTIONS.get("onnx" if self.model.startswith("onnx:") else self.model)
        if known is None:
            raise ValueError(f"model: unknown model {self.model!r} "
                             f"(known: {', '.join(sorted(MODEL_OPTIONS))}:<path>)")
        for where, options in (("options", self.options),
                               ("treatment_options.options", self.treatment_options.get("options", {}))):
            for key in options:
                if key not in known:
                    model = self.model if known else "onnx models"
                    raise ValueError(f"{where}: unknown key {key!r} for {model} (known: {', '.join(known) or 'none'})")
        return self


WorkloadConfig = Annotated[
    Union[Annotated[CommandWorkloadConfig, Tag("command")], Annotated[TvmWorkloadConfig, Tag("tvm")]],
    _kind_of("command", WORKLOAD_KINDS),
]


class RunConfig(_Strict):
    """How many invocations, in which order, with which limits."""

    repetitions: int = Field(default=12, ge=2, description="measured invocations per side, first look")
    max_repetitions: int | None = Field(
        default=None, ge=2, description="adaptive budget per side (default 3x repetitions)")
    batch: int | None = Field(default=None, ge=2, description="invocations per side added per look")
    max_seconds: float = Field(default=900.0, gt=0, description="time budget per workload")
    noise_aware: bool = Field(
        default=True, description="start with as many invocations as the workload's past noise needs")
    warmup: int = Field(default=1, ge=0, description="invocations per side discarded first")
    timeout_s: float = Field(default=60.0, gt=0, description="per invocation")
    seed: int | None = None
    verify_factor: float = Field(default=2.0, ge=1.0, description="repetition multiplier for verify")

    @model_validator(mode="after")
    def _budget(self) -> "RunConfig":
        if self.max_repetitions is not None and self.max_repetitions < self.repetitions:
            raise ValueError("max_repetitions must be >= repetitions")
        return self

    @property
    def budget(self) -> int:
        """Most measured invocations per side one workload may get."""
        return self.max_repetitions if self.max_repetitions is not None else 3 * self.repetitions

    @property
    def step(self) -> int:
        """Invocations per side added at each further look."""
        return self.batch or max(2, self.repetitions // 2)

    @property
    def looks(self) -> int:
        """How many times the data may be judged (for the sequential correction)."""
        extra = self.budget - self.repetitions
        return 1 + -(-extra // self.step)


class StatsConfig(_Strict):
    """Decision parameters handed to :func:`service.stats.compare`."""

    threshold_pct: float = Field(default=1.0, gt=0)
    target_pct: float = Field(default=2.0, gt=0, description="slowdown to catch with `power`")
    power: float = Field(default=0.95, gt=0.5, lt=1)
    alpha: float = Field(default=0.01, gt=0, lt=0.5)
    confidence: float = Field(default=0.99, gt=0.5, lt=1)
    bootstrap_resamples: int = Field(default=2000, ge=200)


class RunnerConfig(_Strict):
    """Where the workloads run."""

    kind: Literal["cpu", "gpu", "rpc"] = "cpu"
    device: str | None = Field(default=None, description="device name; default: host name or rpc key")
    threads: int | None = Field(default=None, ge=1, description="TVM_NUM_THREADS; default: all cores")
    tracker: str | None = Field(default=None, pattern=r"^[^:]+:\d+$", description="rpc: host:port")
    key: str | None = Field(default=None, description="rpc: device key at the tracker")
    target: dict[str, Any] | None = Field(default=None, description="TVM target; default per kind")

    @model_validator(mode="after")
    def _rpc_needs_tracker(self) -> "RunnerConfig":
        if self.kind == "rpc" and (not self.tracker or not self.key):
            raise ValueError("an rpc runner needs tracker and key")
        return self


class AlertsConfig(_Strict):
    """Webhooks told when a regression is confirmed (``regress``) or ``fixed``."""

    webhooks: list[str] = Field(default_factory=list, description="URLs that get a JSON POST")
    secret_env: str = Field(default="ABWATCH_ALERT_SECRET",
                            description="environment variable holding the HMAC-SHA256 signing secret")
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="per attempt (connect and read)")
    attempts: int = Field(default=3, ge=1, le=10)
    backoff_s: float = Field(default=1.0, ge=0, le=60, description="first retry's wait; doubles each time")
    dashboard_url: str | None = Field(default=None, description="base URL for links in messages")


class ServerConfig(_Strict):
    """``abwatch serve``: the API's write token and request limits."""

    token_env: str = Field(default="ABWATCH_API_TOKEN", description="environment variable with the bearer token")
    max_body_mb: float = Field(default=10.0, gt=0, description="largest request body accepted")


class WatchConfig(_Strict):
    """``abwatch watch``: which commits of the branch to test, against what, and how far to escalate.

    ``control``: ``previous`` (the last commit of the branch this watch tested and built),
    ``parent`` (the commit's first parent), ``week-start`` (the first tested commit whose
    commit time falls in the same UTC week as the new commit's) or ``fixed:<ref>``.
    ``schedule`` (a 5-field cron expression) switches to nightly mode: the branch head once
    per tick; without it every ``step``-th new commit is tested, polled every ``interval_s``.
    """

    control: str = Field(default="previous", pattern=r"^(previous|parent|week-start|fixed:.+)$")
    start: str | None = Field(default=None, description="first commit to test; default: the head when first seen")
    step: int = Field(default=1, ge=1)
    interval_s: float = Field(default=300.0, gt=0)
    schedule: str | None = None
    timezone: str = "UTC"
    verify: bool = True
    bisect: bool = True
    max_builds_per_range: int = Field(default=16, ge=1)
    devices: list[str] = Field(default_factory=list, description="default: the runner's device")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            from apscheduler.triggers.cron import CronTrigger
            try:
                CronTrigger.from_crontab(value, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"not a cron expression ({exc})") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value


class Config(_Strict):
    """The whole validated configuration."""

    repo: RepoConfig | None = None
    build: BuildConfig
    workloads: list[WorkloadConfig] = Field(min_length=1)
    run: RunConfig = RunConfig()
    stats: StatsConfig = StatsConfig()
    runner: RunnerConfig = RunnerConfig()
    alerts: AlertsConfig = AlertsConfig()
    server: ServerConfig = ServerConfig()
    watch: WatchConfig = WatchConfig()
    cache_dir: Path = DEFAULT_CACHE_DIR

    @model_validator(mode="after")
    def _unique_workloads(self) -> "Config":
        seen: set[str] = set()
        for workload in self.workloads:
            if workload.name in seen:
                raise ValueError(f"workload name {workload.name!r} appears twice")
            seen.add(workload.name)
        if self.build.kind in ("command", "tvm-source") and self.repo is None:
            raise ValueError(f"a {self.build.kind} build needs [repo]")
        if self.build.kind == "tvm-wheel" and any(w.kind == "command" for w in self.workloads):
            raise ValueError("a tvm-wheel build runs tvm workloads only")
        if self.runner.kind != "cpu" and any(w.kind == "command" for w in self.workloads):
            raise ValueError(f"the {self.runner.kind} runner runs tvm workloads only")
        return self

    def workload(self, name: str) -> "CommandWorkloadConfig | TvmWorkloadConfig":
        """The workload called ``name`` (KeyError if absent)."""
        for workload in self.workloads:
            if workload.name == name:
                return workload
        raise KeyError(name)


def _is_local_path(url: str) -> bool:
    return "://" not in url and not (":" in url and "@" in url.split(":", 1)[0])


def _format_loc(loc: tuple) -> str:
    loc = list(loc)
    # pydantic puts the union member's tag into the path: build.<kind>.command -> build.command
    if len(loc) >= 2 and loc[0] == "build" and loc[1] in BUILD_KINDS:
        del loc[1]
    if len(loc) >= 3 and loc[0] == "workloads" and isinstance(loc[1], int) and loc[2] in WORKLOAD_KINDS:
        del loc[2]
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def format_validation_error(source: str, error: ValidationError) -> str:
    """Render pydantic's errors as ``file: key: message`` lines."""
    lines = []
    for item in error.errors():
        message = item["msg"]
        message = message[:1].lower() + message[1:]
        where = _format_loc(item["loc"]) or "(top level)"
        lines.append(f"{source}: {where}: {message}")
    return "\n".join(lines)


def parse_config(data: dict, source: str, base_dir: Path) -> Config:
    """Validate a config mapping; relative local paths resolve against ``base_dir``."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    updates: dict = {}
    if config.repo is not None and _is_local_path(config.repo.url):
        url = config.repo.url.removeprefix("file://")
        updates["repo"] = config.repo.model_copy(update={"url": str((base_dir / url).resolve())})
    if not config.cache_dir.is_absolute():
        updates["cache_dir"] = (base_dir / config.cache_dir).resolve()
    _check_cache_dir(updates.get("cache_dir", config.cache_dir), source)
    workloads = [
        w.model_copy(update={"model": "onnx:" + str((base_dir / w.model[5:]).resolve())})
        if w.kind == "tvm" and w.model.startswith("onnx:") and not Path(w.model[5:]).is_absolute() else w
        for w in config.workloads
    ]
    if workloads != config.workloads:
        updates["workloads"] = workloads
    return config.model_copy(update=updates)


def _check_cache_dir(path: Path, source: str) -> None:
    """The cache directory, or its nearest existing ancestor, must be a directory: a file
    there would fail much later, half-way through a build."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "" if candidate == path else f" ({candidate} is a file)"
                raise ConfigError(f"{source}: cache_dir: {path} is not a directory{where}")
            return


def load_config(path: str | os.PathLike) -> Config:
    """Read and validate a TOML config file; raise :class:`ConfigError` naming file and key."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_config(data, str(path), path.resolve().parent)
