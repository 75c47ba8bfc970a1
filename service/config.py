"""The one typed, validated configuration object of abwatch.

A config is a TOML file (see ``config/example.toml``). :func:`load_config` parses
and validates it into :class:`Config`; every error names the file and the key at
fault, e.g. ``abwatch.toml: build.command: field required``. The object is passed
explicitly to the layers that need it; nothing reads global state.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from abwatch.core.config_base import DURATION_OR_OFF, StrictModel, duration_s, unknown_key_hint
from abwatch.core.errors import UsageError
from abwatch.core.metric_names import Metric
from abwatch.core.plugins import Registry
from abwatch.builders.spec import (  # noqa: F401 - re-exported: the models builders and runners read, re-used here
    ArtifactsConfig, BuildConfig, CacheConfig, CommandBuildConfig, RepoConfig, RunnerConfig,
    SandboxConfig, TvmSourceBuildConfig, TvmWheelBuildConfig,
)
from abwatch.builders.workload_spec import (  # noqa: F401  (re-exported)
    MODEL_SOURCES, SCRIPT_REPO, TREATMENT_OVERRIDES, CommandWorkloadConfig, TvmWorkloadConfig, WorkloadSpec,
)
# Each [[workloads]] entry is validated, resolved and checked by its kind (runners.workloads)
from abwatch.runners import RunnerSection
from abwatch.runners.counters import counter_name
from abwatch.runners.workloads import WORKLOAD_KINDS, WorkloadConfig

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "abwatch"


class ConfigError(UsageError):
    """A configuration file that cannot be read or does not validate."""


class RunConfig(StrictModel):
    """How many invocations, in which order, with which limits."""

    repetitions: int = Field(default=12, ge=2, description="measured invocations per side, first look")
    max_repetitions: int | None = Field(
        default=None, ge=2, description="optional cap on measured invocations per side (default: none, "
                                        "only max_seconds limits a workload)")
    batch: int | None = Field(default=None, ge=1, description="invocations per side added per look")
    max_seconds: float = Field(default=900.0, gt=0, description="time budget per workload")
    compile_repetitions: int = Field(
        default=12, ge=0, description="tvm: most fresh-process compiles per side to judge compile time (0: off)")
    # at least the first look's 3 pairs (FIRST_LOOK, service/compare/instructions.py)
    instruction_repetitions: int = Field(
        default=12, ge=3, description='measure = [..."instructions"]: most counted processes per side')
    counted_jobs: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1,
        description="counted processes run at once (a count does not depend on the machine's load; "
                    "default: the number of CPUs)")
    counter: str = Field(
        default="auto", description="instruction counter: perf (hardware counter), valgrind, or auto (perf where "
                                    "the kernel counts instructions, else valgrind)")
    noise_aware: bool = Field(
        default=True, description="start with as many invocations as the workload's past noise needs")
    warmup: int = Field(default=1, ge=0, description="invocations per side discarded first")
    schedule: Literal["interleaved", "duet", "duet-one-cpu"] = Field(
        default="interleaved", description="how a pair's two timed processes run: one after the other in "
        "ABBA/BAAB order (interleaved), or both at once, each pinned to a core of its own (duet: both see the same "
        "interference; needs 2 CPUs) or both pinned to one CPU, taking turns and judged on CPU time (duet-one-cpu: "
        "on a virtual machine, whose CPUs each change speed by the second, the most alike pairs); the duets need "
        "the cpu runner, and a workload marked memory_bound stays interleaved")
    timeout_s: float = Field(default=60.0, gt=0, description="per invocation")
    seed: int | None = None
    verify_factor: float = Field(default=2.0, ge=1.0, description="repetition multiplier for verify")

    @model_validator(mode="after")
    def _budget(self) -> RunConfig:
        if self.max_repetitions is not None and self.max_repetitions < self.repetitions:
            raise ValueError("max_repetitions must be >= repetitions")
        return self

    @field_validator("counter")
    @classmethod
    def _counter(cls, value: str) -> str:
        return counter_name(value)  # a counter registered later (runners.counters.COUNTERS) counts too

    @property
    def step(self) -> int:
        """Invocations per side added at each further look."""
        return self.batch or max(2, self.repetitions // 2)


class StatsConfig(StrictModel):
    """Decision parameters handed to :func:`service.stats.compare`."""

    threshold_pct: float = Field(default=1.0, gt=0)
    instructions_threshold_pct: float = Field(
        default=0.5, gt=0, description="the smallest change in instructions worth reporting (%)")
    thresholds: dict[Metric, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="the smallest change worth reporting (%) of the other metrics, by name "
        "(cpu_time, max_rss); each metric has its default (service.compare.metrics)")
    target_pct: float = Field(default=2.0, gt=0, description="slowdown to catch with `power`")
    power: float = Field(default=0.95, gt=0.5, lt=1)
    alpha: float = Field(default=0.01, gt=0, lt=0.5)
    confidence: float = Field(default=0.99, gt=0.5, lt=1)
    equivalence_alpha: float = Field(default=0.05, gt=0, lt=0.5,
                                     description="`same` = two one-sided tests at this level each")
    bootstrap_resamples: int = Field(default=2000, ge=200)
    contention_share: float = Field(
        default=0.5, ge=0, le=1, description="heavy contention: measured processes that ran less than this share "
        "of their wall time on a CPU (and were preempted), or whose samples were each likely preempted; then the "
        "verdict is judged on CPU time per process (0: never)")


class AlertsConfig(StrictModel):
    """Webhooks told when a regression is confirmed (``regress``) or ``fixed``."""

    webhooks: list[str] = Field(default_factory=list,
                                description="URLs that get a JSON POST, or env:NAME for a URL held by "
                                            "the environment variable NAME (stored and shown redacted)")
    secret_env: str = Field(default="ABWATCH_ALERT_SECRET",
                            description="environment variable holding the HMAC-SHA256 signing secret")
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="per attempt (connect and read)")
    attempts: int = Field(default=3, ge=1, le=10)
    backoff_s: float = Field(default=1.0, ge=0, le=60, description="first retry's wait; doubles each time")
    deadline_s: float = Field(default=30.0, gt=0, le=600,
                              description="the whole of one delivery round, however slowly a receiver answers")
    retry_for_s: float = Field(default=86400.0, gt=0,
                               description="later rounds retry an undelivered alert for this long, then give up")
    dashboard_url: str | None = Field(default=None, description="base URL for links in messages")


class GithubConfig(StrictModel):
    """``[github]``: commit statuses on the watched repository's GitHub mirror (optional)."""

    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", description="owner/name on GitHub")
    api_url: str = Field(default="https://api.github.com", pattern=r"^https?://[^\s]+$",
                         description="the API's base URL (GitHub Enterprise: https://HOST/api/v3)")
    token_env: str = Field(default="GITHUB_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                           description="environment variable with a token that may write statuses")
    context: str = Field(default="abwatch", min_length=1, max_length=64,
                         description="status context prefix; the device name is appended")
    # pull requests (service.watch.pulls): commands in comments, answered in the pull request
    webhook_secret_env: str = Field(default="ABWATCH_GITHUB_WEBHOOK_SECRET", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="environment variable with the webhook's secret (HMAC-SHA256)")
    command_prefix: str = Field(default="@abwatch", min_length=2, max_length=64, pattern=r"^\S+$",
                                description="what a comment's command line begins with")
    pr_runs: Literal["off", "command", "auto"] = Field(
        default="command", description="off: no pull-request runs; command: on a comment command; "
                                       "auto: also when a pull request is opened or pushed to")
    allow: list[str] = Field(default_factory=list,
                             description="GitHub logins whose commands are taken without asking the API "
                                         "(others need write access to the repository)")
    label: str = Field(default="perf-regression", min_length=1, max_length=50,
                       description="label set on a pull request with an untriaged regression")


class ServerConfig(StrictModel):
    """``abwatch serve``: the API's write token, request limits, and what a crowd of readers gets.

    ``max_in_flight`` requests are handled at once; it also sizes the database connection pool
    and the worker threads, so that a request that got in never waits for either. Past it a
    request waits up to ``queue_s`` for a turn, then gets 503 with ``Retry-After``. Reads
    without the write token are rate-limited per client address (``rate_limit``, 429 with
    ``Retry-After``); requests with the token are not, nor signed GitHub deliveries (their own
    ``webhook_in_flight`` turns, waited for, never refused). Silent connections are closed.
    """

    token_env: str = Field(default="ABWATCH_API_TOKEN", description="environment variable with the bearer token")
    max_body_mb: float = Field(default=10.0, gt=0, description="largest request body accepted")
    rate_limit: str = Field(
        default="10/second;300/minute", max_length=200,
        description="requests per client address without the token, in the `limits` library's notation "
                    "(\"N/second\", \"N per 5 minutes\", several joined by ';'); an empty string: no limit")
    max_in_flight: int = Field(default=8, ge=1, le=1000,
                               description="requests handled at once (= database connections = worker threads)")
    queue_s: float = Field(default=1.0, ge=0, le=60,
                           description="how long a request past max_in_flight waits for a turn before its 503")
    pool_timeout_s: float = Field(default=2.0, gt=0, le=300,
                                  description="how long a request waits for a database connection before its 503")
    statement_timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="PostgreSQL statement_timeout of the server's connections: a query that runs longer is "
                    "cancelled and the request answered 503")
    max_connections: int = Field(default=1000, ge=1, description="open connections; past it: idle ones closed, or 503")
    header_timeout_s: float = Field(default=10.0, gt=0, le=300, description="time a connection has to send a request's head")
    keepalive_timeout_s: float = Field(default=5.0, gt=0, le=300, description="an idle keep-alive connection's life")
    webhook_in_flight: int = Field(default=4, ge=1, le=100, description="signed GitHub deliveries handled at once")

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit(cls, value: str) -> str:
        from limits import parse_many

        if value.strip():
            try:
                items = parse_many(value)
            except ValueError as exc:
                raise ValueError(f"not a rate limit ({exc}); e.g. \"10/second;300/minute\"") from None
            if any(item.amount < 1 for item in items):
                raise ValueError(f"{value!r}: each limit allows at least 1 request (an empty string: no limit)")
        return value


def cron_trigger(expr: str, timezone: str):
    """The APScheduler ``CronTrigger`` of a ``[watch] schedule``.

    Five fields are crontab's (minute hour day month day-of-week); six put seconds first
    (second minute hour day month day-of-week, e.g. ``*/5 * * * * *``), for ticks finer than a
    minute. Fields mean what APScheduler 3 makes of them (day-of-week 0 is Monday, or use
    names: ``mon-fri``). ``ValueError`` names what is wrong.
    """
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) == 6:
        second, minute, hour, day, month, day_of_week = fields
        return CronTrigger(second=second, minute=minute, hour=hour, day=day, month=month,
                           day_of_week=day_of_week, timezone=timezone)
    if len(fields) != 5:
        raise ValueError(f"{len(fields)} fields; expected 5 (minute hour day month day-of-week) "
                         "or 6 (second first)")
    return CronTrigger.from_crontab(expr, timezone=timezone)


@dataclass(frozen=True)
class ControlForm:
    """How ``[watch] control`` names a rule: ``name``, or ``name:<argument>`` where the rule
    takes one (``argument`` says what it is; None: it takes none)."""

    name: str
    argument: str | None = None


# The control rules a config may name. The rules themselves are service.watch.controls's
# CONTROL_RULES, registered by these names and only these: they drive comparisons, which this
# module (below every service package) cannot import.
CONTROL_FORMS: Registry[ControlForm] = Registry("control rule", ((form.name, form) for form in (
    ControlForm("previous"), ControlForm("parent"), ControlForm("week-start"), ControlForm("fixed", "a commit or ref"),
)))


def control_name(value: str) -> str:
    """``value`` if it names a rule of :data:`CONTROL_FORMS` as that rule is written, else ValueError."""
    name, colon, argument = value.partition(":")
    form = CONTROL_FORMS.get(name, None)
    if form is None:
        raise ValueError(CONTROL_FORMS.unknown(name))
    if form.argument is None and colon:
        raise ValueError(f"the {name} rule takes no argument")
    if form.argument is not None and not argument:
        raise ValueError(f"the {name} rule needs {form.argument}: {name}:<{form.argument.split()[-1]}>")
    return value


BisectedChange = Literal["regression", "improvement"]  # a confirmed change [watch] bisect may name


class WatchConfig(StrictModel):
    """``abwatch watch``: which commits of the branch to test, against what, and how far to escalate.

    ``control``: ``previous`` (the last commit of the branch this watch tested and built),
    ``parent`` (the commit's first parent), ``week-start`` (the first tested commit whose
    commit time falls in the same UTC week as the new commit's) or ``fixed:<ref>``.
    ``schedule`` (a cron expression, :func:`cron_trigger`) switches to nightly mode: the branch
    head once per tick; without it every ``step``-th new commit is tested, polled every ``interval_s``.
    """

    control: str = Field(default="previous", description="a rule of CONTROL_FORMS: name or name:argument")
    start: str | None = Field(default=None, description="first commit to test; default: the head when first seen")
    step: int = Field(default=1, ge=1)
    interval_s: float = Field(default=300.0, gt=0)
    schedule: str | None = None
    timezone: str = "UTC"
    verify: bool = True
    bisect: list[BisectedChange] = Field(
        default_factory=lambda: list[BisectedChange](["regression"]),
        description='which confirmed changes are bisected: "regression", "improvement"; true = ["regression"], '
                    "false = none")
    max_builds_per_range: int = Field(default=16, ge=1)
    devices: list[str] = Field(default_factory=list, description="default: the runner's device")
    heartbeat_s: float = Field(default=60.0, gt=0, description="how often a worker beats its device's heartbeat")
    stale_after: str = Field(default="6h", pattern=DURATION_OR_OFF, description="a device whose worker has not "
                             "beaten its heartbeat for this long (90s, 30m, 6h, 2d; off) raises one data-stoppage alert")

    @model_validator(mode="after")
    def _beats_before_stale(self) -> WatchConfig:
        if (self.stale_after_s or float("inf")) < 2 * self.heartbeat_s:
            raise ValueError(f"stale_after {self.stale_after!r} is shorter than two heartbeats (heartbeat_s "
                             f"{self.heartbeat_s:g}): every device would read as silent")
        return self

    @property
    def stale_after_s(self) -> float | None:
        """``stale_after`` in seconds; None when it is off (or 0)."""
        return duration_s(self.stale_after) or None

    @field_validator("control")
    @classmethod
    def _control(cls, value: str) -> str:
        return control_name(value)

    @field_validator("bisect", mode="before")
    @classmethod
    def _bisect(cls, value: object) -> object:
        """``true`` (the regressions, as before lists existed), ``false`` (nothing) or a list."""
        if isinstance(value, bool):
            return ["regression"] if value else []
        if isinstance(value, list):
            if len(set(map(str, value))) != len(value):
                raise ValueError(f"{value!r} names a change twice")
            return value
        raise ValueError(f'{value!r}: expected true, false or a list of "regression", "improvement"')

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                cron_trigger(value, "UTC")
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


class RetentionConfig(StrictModel):
    """``[retention]``: how long raw samples are kept. ``abwatch watch`` prunes, on ``schedule``
    (a cron expression in ``[watch] timezone``, nightly by default), the samples of runs that
    finished more than ``samples_days`` days ago and opened nothing, as ``abwatch db prune
    --older-than samples_days --yes`` does; 0 keeps them forever."""

    samples_days: float = Field(default=0, ge=0, description="prune raw samples of runs older than this "
                                "that opened no regression (0: keep forever)")
    schedule: str = Field(default="30 3 * * *", description="when the watch prunes (cron, [watch] timezone)")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        try:
            cron_trigger(value, "UTC")
        except ValueError as exc:
            raise ValueError(f"not a cron expression ({exc})") from None
        return value


class Config(StrictModel):
    """The whole validated configuration."""

    repo: RepoConfig | None = None
    build: BuildConfig
    workloads: list[WorkloadConfig] = Field(min_length=1)
    run: RunConfig = RunConfig()
    stats: StatsConfig = StatsConfig()
    runner: RunnerSection = RunnerConfig()
    sandbox: SandboxConfig = SandboxConfig()
    alerts: AlertsConfig = AlertsConfig()
    github: GithubConfig | None = None
    server: ServerConfig = ServerConfig()
    watch: WatchConfig = WatchConfig()
    cache_dir: Path = DEFAULT_CACHE_DIR
    cache: CacheConfig = CacheConfig()
    artifacts: ArtifactsConfig = ArtifactsConfig()
    retention: RetentionConfig = RetentionConfig()
    _source: str | None = PrivateAttr(default=None)  # the file it was read from (load_config)

    @property
    def repository(self) -> RepoConfig:
        """``[repo]``, which a watch, a bisection and a git build need (ConfigError naming the file if absent)."""
        if self.repo is None:
            raise ConfigError(f"{self.at('repo')}: this needs a [repo] section")
        return self.repo

    def at(self, key: str) -> str:
        """How an error found later names ``key``: ``file: key`` when the config came from a file."""
        return f"{self._source}: {key}" if self._source else key

    @model_validator(mode="after")
    def _unique_workloads(self) -> Config:
        seen: set[str] = set()
        for workload in self.workloads:
            if workload.name in seen:
                raise ValueError(f"workload name {workload.name!r} appears twice")
            seen.add(workload.name)
        if self.build.needs_repo and self.repo is None:
            raise ValueError(f"a {self.build.kind} build needs [repo]")
        if self.run.schedule != "interleaved" and self.runner.kind != "cpu":
            # a GPU or a board is one device: its two sides at once would share it, not run apart
            raise ValueError(f'run.schedule = "{self.run.schedule}" runs both sides at once on this host\'s CPUs: '
                             f'the cpu runner only (runner.kind is {self.runner.kind!r})')
        for workload in self.workloads:  # what its kind needs of the runner and the build
            kind = WORKLOAD_KINDS[workload.kind]
            refusal = kind.check_runner(workload, self.runner.kind) or kind.check_build(workload, self.build)
            if refusal is not None:
                raise ValueError(refusal)
        return self

    def secret_variables(self) -> list[str]:
        """The environment variables whose values this config makes secrets (masked wherever
        shown or stored): the API token, the alert secret, the GitHub token, ``env:`` webhooks, the
        shared compiler cache's and the artifact store's passwords."""
        names = [self.server.token_env, self.alerts.secret_env]
        names += self.build.secret_variables()
        if self.artifacts.password_env:
            names.append(self.artifacts.password_env)
        names += [self.github.token_env, self.github.webhook_secret_env] if self.github else []
        names += [hook.removeprefix("env:") for hook in self.alerts.webhooks if hook.startswith("env:")]
        return names

    def workload(self, name: str) -> WorkloadSpec:
        """The workload called ``name`` (KeyError if absent)."""
        for workload in self.workloads:
            if workload.name == name:
                return workload
        raise KeyError(name)


def _is_local_path(url: str) -> bool:
    return "://" not in url and not (":" in url and "@" in url.split(":", 1)[0])


def _format_loc(where: tuple) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def format_validation_error(source: str, error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Render pydantic's errors as ``file: key: message`` lines; an unknown key of ``model``
    (the root the errors are of) says which known key it is closest to."""
    lines = []
    for item in error.errors():
        message = item["msg"]
        message = message[:1].lower() + message[1:]
        if model is not None and item["type"] == "extra_forbidden":
            message += unknown_key_hint(model, tuple(item["loc"]))
        where = _format_loc(item["loc"]) or "(top level)"
        lines.append(f"{source}: {where}: {message}")
    return "\n".join(lines)


def parse_config(data: dict, source: str, base_dir: Path) -> Config:
    """Validate a config mapping; relative local paths resolve against ``base_dir``."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, Config)) from None
    updates: dict = {}
    if config.repo is not None and _is_local_path(config.repo.url):
        url = config.repo.url.removeprefix("file://")
        updates["repo"] = config.repo.model_copy(update={"url": str((base_dir / url).resolve())})
    if not config.cache_dir.is_absolute():
        updates["cache_dir"] = (base_dir / config.cache_dir).resolve()
    _check_cache_dir(updates.get("cache_dir", config.cache_dir), source)
    try:
        build = config.build.resolve(base_dir)
    except UsageError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if build is not config.build:
        updates["build"] = build
    workloads = [_resolved(w, index, source, base_dir) for index, w in enumerate(config.workloads)]
    if workloads != config.workloads:
        updates["workloads"] = workloads
    config = config.model_copy(update=updates)
    config._source = source
    return config


def _resolved(workload: WorkloadSpec, index: int, source: str, base_dir: Path) -> WorkloadSpec:
    """``workload`` with its local paths made absolute against ``base_dir`` (the config's
    directory), as its kind resolves them (a ``script:`` file's SHA-256 read, so the file's
    content is part of the workload's identity)."""
    try:
        return WORKLOAD_KINDS[workload.kind].resolve(workload, base_dir)
    except UsageError as exc:
        raise ConfigError(f"{source}: workloads[{index}] ({workload.name}): {exc}") from None


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
