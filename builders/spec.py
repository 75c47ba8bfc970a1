"""What builders and runners read of the configuration: the build, cache, artifact store,
runner and sandbox models, and the protocols a builder or runner takes its settings by.

The words every layer shares (:class:`~abwatch.core.config_base.StrictModel`,
:func:`~abwatch.core.config_base.spec_hash`, commits, errors) are in :mod:`abwatch.core`, below
this module. :mod:`abwatch.service.config` puts these models into the whole
:class:`~abwatch.service.config.Config`; a builder or runner takes only the parts it needs
(:class:`BuildSettings` is the part a builder reads). The workloads' models are in
:mod:`abwatch.builders.workload_spec`, just above this module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import Field, PlainValidator, SerializeAsAny, field_validator, model_validator

from abwatch.core.config_base import ENV_NAME, StrictModel, kind_validator, spec_hash
from abwatch.core.errors import UsageError
from abwatch.core.plugins import Registry


# The file a TVM build writes into its artifact: which Python runs the worker, and its environment.
ARTIFACT_INFO = "abwatch-artifact.json"


class RepoConfig(StrictModel):
    """The git repository under watch."""

    url: str = Field(min_length=1)
    branch: str = "main"


class CacheConfig(StrictModel):
    """``[cache]``: how much of the disk the artifact cache (and builds under ``cache_dir``) may use.

    Before each build the least recently used artifacts are evicted until the cache is within
    ``max_gb`` and the file system of ``cache_dir`` has ``min_free_gb`` free; a build that still
    lacks that room is refused as an infrastructure failure (the commit stays untested).
    """

    max_gb: float | None = Field(default=None, gt=0, description="largest size of the artifact cache; least "
                                 "recently used entries are evicted past it (default: no size limit)")
    min_free_gb: float = Field(default=1.0, ge=0, description="free space the file system of cache_dir must keep "
                               "for a build; evicts, then refuses the build (an infrastructure failure) below it")


class BuildSpec(StrictModel):
    """Base of the build sections: one cache-key hash, over what each kind says matters, and
    what the rest of abwatch asks of a build without asking which kind it is. Each kind's
    model narrows ``kind`` to its own name (``Literal["command"]``), names its builder class
    (``builder``, imported only when a build is made) and is registered in :data:`BUILD_KINDS`."""

    kind: str
    # the builder of this kind, as "module:Class" (pkgutil.resolve_name): builders/registry.py
    # loads it, so the config parser never imports GitPython or the build tools
    builder: ClassVar[str]
    # whether a build of this kind checks out the commit (the config then needs [repo])
    needs_repo: ClassVar[bool] = True
    # whether its artifacts hold TVM (the records then describe a TVM build)
    builds_tvm: ClassVar[bool] = False

    def secret_variables(self) -> list[str]:
        """The environment variables this section makes secrets (masked wherever shown)."""
        return []

    def kept_source(self) -> list[str] | None:
        """The repository paths its artifacts keep (``script:repo:`` workloads read them);
        None: a build of this kind keeps no source tree."""
        return None

    def resolve(self, base_dir: Path) -> BuildSpec:
        """This section with its local paths made absolute against ``base_dir`` (the config
        file's directory); raises UsageError starting with the key at fault."""
        return self

    def hashed(self) -> dict[str, Any]:
        """The part of the section that changes what a build produces."""
        raise NotImplementedError

    def config_hash(self) -> str:
        """Hash of :meth:`hashed` (part of every cache key and of each build row)."""
        return spec_hash(self.hashed())

    def for_untrusted(self) -> BuildSpec:
        """This section for code nobody merged (try and pull-request jobs). A kind whose builds
        share nothing but their finished artifacts (a clean checkout each time) is unchanged;
        one that carries state from build to build keeps such code apart (tvm-source)."""
        return self


class CommandBuildConfig(BuildSpec):
    """Build by running a command in a clean checkout of the commit."""

    kind: Literal["command"] = "command"
    builder: ClassVar[str] = "abwatch.builders.command:CommandBuilder"
    command: list[str] = Field(min_length=1)
    artifacts: str = "."
    timeout_s: float = Field(default=1800.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    # globs in the artifacts whose sizes are the build's binary_size (none: not measured)
    binary_size: list[str] = Field(default_factory=list, description="globs in the artifacts directory "
                                   "(e.g. lib/*.so) whose sizes are the build's binary_size, judged by every run")
    untrusted: bool = Field(
        default=False, description="set by try and pull-request jobs, not in a config file: artifacts kept apart "
        "(keys of their own) and never pushed to the shared store (see for_untrusted)")

    @field_validator("artifacts")
    @classmethod
    def _relative(cls, value: str) -> str:
        if Path(value).is_absolute() or ".." in Path(value).parts:
            raise ValueError("must be a path inside the checkout")
        return value

    @field_validator("binary_size")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
                raise ValueError(f"{pattern!r} must be a glob inside the artifacts directory")
        return value

    def hashed(self) -> dict[str, Any]:
        """Everything that changes what a build produces (not its time limit)."""
        # measuring builds nothing; untrusted only when set, which keeps the keys made before it
        return self.model_dump(exclude={"timeout_s", "binary_size", *(() if self.untrusted else ("untrusted",))})

    def for_untrusted(self) -> CommandBuildConfig:
        """The build of unmerged code shares nothing with trusted ones: its artifacts have keys of
        their own, so a trusted build never takes one from the cache, and no store is given it."""
        return self.model_copy(update={"untrusted": True})


class TvmWheelBuildConfig(BuildSpec):
    """Install a released apache-tvm wheel (refs are versions, e.g. ``0.27.0.post1``) into a venv."""

    kind: Literal["tvm-wheel"] = "tvm-wheel"
    builder: ClassVar[str] = "abwatch.builders.tvm_wheel:TvmWheelBuilder"
    needs_repo: ClassVar[bool] = False  # a released version, no checkout
    builds_tvm: ClassVar[bool] = True
    packages: list[str] = Field(default_factory=list, description="more pip requirements, e.g. onnx")
    timeout_s: float = Field(default=900.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="added to the allow-listed environment")

    def hashed(self) -> dict[str, Any]:
        """What changes the venv besides the version: the packages, in any order."""
        return {"kind": self.kind, "packages": sorted(self.packages)}


# ccache's remote storage backends abwatch hands a password to, with their default ports
REMOTE_STORAGE_PORTS = {"redis": 6379, "http": 80}


def remote_storage_url(value: str) -> str:
    """``value`` if it is a remote storage URL ccache takes and that holds no secret, else ValueError.

    ccache stops a compile on a URL it cannot parse, which would fail every build as if the
    commit were broken: the URL is checked here, before any build. ccache's attributes follow
    ``|`` (``redis://cache:6379/0|connect-timeout=500``); a credential is never among them.
    """
    url, *attributes = value.split("|")
    if any(c.isspace() for c in value) or "$" in value:  # ccache splits at spaces and expands $VAR
        raise ValueError("no spaces or $ in the URL; attributes follow |")
    try:
        parts = urlsplit(url)
        if parts.port == 0:  # .port raises ValueError for a port that is not a number
            raise ValueError("port 0")
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if parts.scheme not in REMOTE_STORAGE_PORTS or not parts.hostname:
        raise ValueError(f"{url!r}: expected redis://HOST[:PORT][/DB] or http://HOST[:PORT]/PATH "
                         "(ccache's Redis or HTTP storage)")
    if parts.password is not None or parts.query or parts.fragment:
        raise ValueError("the URL holds no password: name the environment variable that holds it in "
                         "ccache_remote_password_env")
    if parts.scheme == "redis" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError(f"{url!r}: a Redis URL's path is its database number")
    for attribute in attributes:
        name = attribute.partition("=")[0]
        if not re.fullmatch(r"[a-z-]+", name) or re.search(r"token|passw|auth|secret", name):
            raise ValueError(f"attribute {name!r}: expected ccache's name=value (a token or password comes "
                             "from ccache_remote_password_env)")
    return value


class TvmSourceBuildConfig(BuildSpec):
    """Build TVM from source at a commit with CMake + Ninja (+ ccache), incrementally.

    ``cmake`` entries become ``set(KEY VALUE)`` lines of ``config.cmake`` (``USE_LLVM``,
    ``USE_CUDA``, ...). ``submodule_rewrites`` maps URL prefixes to mirrors (git's
    ``url.<mirror>.insteadOf <prefix>``). ``python_packages`` go into the artifact's venv;
    ``{ffi_version}`` is replaced by the release of the ``3rdparty/tvm-ffi`` submodule's tag, or
    by the submodule's own source when it sits between tags. ``keep`` copies repository paths
    into the artifact's ``src/``; ``check_import`` is imported after each build.
    """

    kind: Literal["tvm-source"] = "tvm-source"
    builder: ClassVar[str] = "abwatch.builders.tvm_source:TvmSourceBuilder"
    builds_tvm: ClassVar[bool] = True
    cmake: dict[str, str] = Field(default_factory=lambda: {"USE_LLVM": "ON"})
    runtime_only: bool = False
    targets: list[str] = Field(default_factory=list, description="default: all, or the runtime only")
    libraries: list[str] = Field(default_factory=lambda: ["*.so", "lib/*.so"],
                                 description="globs in the build directory kept as lib/")
    python_dir: str = "python"
    # TVM's own Python dependencies (its pyproject.toml: tvm-ffi, ml_dtypes, numpy,
    # typing_extensions; without ml_dtypes a TVMScript constant fails to build), then the RPC
    # server's (tornado, psutil, cloudpickle)
    python_packages: list[str] = Field(
        default_factory=lambda: ["numpy", "apache-tvm-ffi=={ffi_version}", "ml_dtypes", "typing_extensions",
                                 "tornado", "psutil", "cloudpickle"])
    keep: list[Annotated[str, Field(pattern=r"^[^/].*")]] = Field(
        default_factory=list, description="repository paths copied into the artifact's src/ "
        "(scripts that script:repo: workloads and command workloads read)")
    check_import: str = Field(default="tvm", description="Python module imported with each new build (for "
                              "tvm with LLVM, a small module is compiled too); empty: no check")
    submodule_rewrites: dict[str, str] = Field(default_factory=dict)
    submodules: list[str] | None = Field(
        default=None, description="submodule paths to check out, each with its parents and its own "
        "submodules; default: all, recursively")
    submodule_fallbacks: dict[str, Path] = Field(
        default_factory=dict, description="submodule path (from the repository's root, e.g. "
        "3rdparty/tvm-ffi/3rdparty/dlpack) -> a directory whose files stand in for it when its pinned "
        "commit cannot be checked out (missing from the mirror)")
    jobs: int | None = Field(default=None, ge=1)
    cache_limit_gb: float = Field(default=20.0, gt=0)
    pack_deltas: bool = Field(default=True, description="keep older builds' large files as binary deltas")
    timeout_s: float = Field(default=7200.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="added to the allow-listed environment")
    ccache_remote: str | None = Field(
        default=None, description="ccache's remote storage, shared by build hosts, behind the local cache: "
        "redis://HOST[:PORT][/DB] or http://HOST[:PORT]/PATH, with ccache's |attribute=value suffixes; "
        "no password here (ccache_remote_password_env)")
    ccache_remote_password_env: str | None = Field(
        default=None, pattern=ENV_NAME, description="environment variable holding the remote storage's "
        "password (Redis AUTH; HTTP basic auth for the URL's user) or, for HTTP without a user, its bearer token")
    untrusted: bool = Field(
        default=False, description="set by try and pull-request jobs, not in a config file: a workspace and "
        "local compiler cache of their own, no remote compiler cache, artifacts kept apart (see for_untrusted)")

    @field_validator("ccache_remote")
    @classmethod
    def _remote_storage(cls, value: str | None) -> str | None:
        return None if value is None else remote_storage_url(value)

    @model_validator(mode="after")
    def _redis_user_needs_password(self) -> TvmSourceBuildConfig:
        # ccache reads a lone user part of a Redis URL as the password: it is refused there, and
        # a user name goes with a password from the environment (USER:PASSWORD)
        if self.ccache_remote and self.ccache_remote.startswith("redis:") and "@" in self.ccache_remote.split("|")[0] \
                and not self.ccache_remote_password_env:
            raise ValueError("ccache_remote: a Redis user needs its password in the environment variable named by "
                             "ccache_remote_password_env")
        return self

    def secret_variables(self) -> list[str]:
        return [self.ccache_remote_password_env] if self.ccache_remote_password_env else []

    def kept_source(self) -> list[str] | None:
        return self.keep

    def resolve(self, base_dir: Path) -> TvmSourceBuildConfig:
        """``submodule_fallbacks`` made absolute; each must be a directory now, not half-way
        through a build that needs it."""
        if not self.submodule_fallbacks:
            return self
        resolved = {}
        for name, directory in self.submodule_fallbacks.items():
            path = (base_dir / directory).resolve()
            if not path.is_dir():
                raise UsageError(f"build.submodule_fallbacks.\"{name}\": {path} is not a directory")
            resolved[name] = path
        return self.model_copy(update={"submodule_fallbacks": resolved})

    def hashed(self) -> dict[str, Any]:
        """What changes the artifact (not limits, mirrors, parallelism, packing or the shared compiler
        cache: ccache returns what the compiler would)."""
        payload = self.model_dump(exclude={"submodule_rewrites", "submodules", "submodule_fallbacks", "jobs",
                                           "cache_limit_gb", "timeout_s", "pack_deltas", "check_import",
                                           "ccache_remote", "ccache_remote_password_env"})
        for newer in ("env", "keep", "untrusted"):  # keeps the keys of builds made before these existed
            if not payload[newer]:
                del payload[newer]
        return payload

    def workspace_hash(self) -> str:
        """Hash of what changes the compiled output: configurations that share it share a build dir."""
        return spec_hash(self.model_dump(include={"cmake", "runtime_only", "targets", "untrusted"}
                                         if self.untrusted else {"cmake", "runtime_only", "targets"}))

    def for_untrusted(self) -> TvmSourceBuildConfig:
        """Incremental builds reuse their workspace's objects and the compiler cache's entries: a
        build of unmerged code could leave objects (or poisoned cache entries) that a later
        trusted build links, and it would see the remote cache's credential. So it builds in a
        workspace and local ccache of its own (builders/tvm_source.py), without the remote
        storage, and its artifacts have keys of their own."""
        return self.model_copy(update={"untrusted": True, "ccache_remote": None, "ccache_remote_password_env": None})


class ArtifactsConfig(StrictModel):
    """``[artifacts]``: the artifact store build and device hosts share (:mod:`abwatch.builders.artifact_store`).

    ``store`` is the base URL of a WebDAV server (nginx's ``dav_methods PUT``): objects go to
    ``{store}/cas/<sha256>``; the manifests are in the database. No password in the URL: ``user``
    with the password in the environment variable ``password_env`` (HTTP basic auth). Each manifest
    carries an HMAC made with the key in the environment variable ``manifest_key_env``.
    """

    store: str | None = Field(default=None, description="http(s)://HOST[:PORT]/PREFIX of the shared store; "
                              "none: every host builds for itself")
    user: str | None = Field(default=None, min_length=1, pattern=r"^[^:\s]+$", description="basic auth user")
    password_env: str | None = Field(default=None, pattern=ENV_NAME,
                                     description="environment variable holding the store's password")
    manifest_key_env: str = Field(
        default="ABWATCH_MANIFEST_KEY", pattern=ENV_NAME, description="environment variable holding the key that "
        "authenticates the manifests (HMAC-SHA256; the same on every host, at least 32 characters): with a store "
        "and no key, abwatch refuses to start")
    timeout_s: float = Field(default=30.0, gt=0, le=600, description="per request (connect and each read)")
    wait_s: float = Field(default=7200.0, gt=0, description="how long a host waits for another host's build of "
                          "a commit it needs before it builds the commit itself")

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r}: expected http(s)://HOST[:PORT]/PREFIX (a WebDAV server)")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise ValueError("the URL holds no credentials: set user, and the password's variable in password_env")
        return value.rstrip("/")


def _kind_name(model: type[BuildSpec]) -> str:
    return model.model_fields["kind"].default


# The kinds of build by name (``[build] kind``), each with its config model: the one list of
# them. builders/registry.py's BUILDERS loads each model's ``builder`` under the same name.
BUILD_KINDS: Registry[type[BuildSpec]] = Registry(
    "build kind", ((_kind_name(model), model) for model in (CommandBuildConfig, TvmWheelBuildConfig, TvmSourceBuildConfig)),
    config=lambda model: model)

# A ``[build]`` section of any registered kind (``command`` where it names none: configs from
# before kinds stay valid): validated by its kind's model, dumped with all of its fields.
BuildConfig = Annotated[SerializeAsAny[BuildSpec], PlainValidator(kind_validator(BUILD_KINDS, "command", "build"))]


# TVM_NUM_THREADS as a config writes it: a number of threads, or "all" (every core)
Threads = Annotated[int, Field(ge=1)] | Literal["all"]


class RunnerConfig(StrictModel):
    """Where the workloads run."""

    kind: str = Field(default="cpu", description="a runner of runners.RUNNERS (the config checks the name there)")
    device: str | None = Field(default=None, description="device name; default: host name or rpc key")
    # One thread by default on this host's CPU: under heavy contention a verdict is judged on
    # each process's CPU time, which only a one-thread process keeps honest (a pool's threads
    # spin while they wait for a pre-empted sibling); on several threads it is refused
    # (service/compare/contended.py), so on a busy host the old default, all cores, decided nothing.
    threads: Threads | None = Field(
        default=None, description='TVM_NUM_THREADS of measured TVM processes: a number, or "all" (every core); '
        "default: 1 on this host's CPU (a verdict that stands on a busy host), all cores for a GPU's or a "
        "board's host-side worker; a workload's own `threads` comes first")
    # A forked child skips the interpreter's start and ``import tvm`` (~0.55 s of a ~0.9 s
    # invocation of builtin:mlp here: benchmarks/tvm_worker_phases.py) and is still a process
    # of its own with its own samples; runners/fork_servers.py, TimedServers, says how it stays
    # independent (servers restarted, each child's layout randomised). The default since its A/A
    # rate was measured on real TVM (761 forked runs, none false: docs/statistics.md); a run
    # capped below three server pairs, or a first look of fewer pairs than three servers' children,
    # serves fewer children a server (driver._children_within).
    processes: Literal["fresh", "forked"] = Field(
        default="forked", description="tvm, on this host's CPU: how each timed worker starts: forked (a "
        "child of a per-build, per-side fork server that has imported TVM) or fresh (a new interpreter "
        "that imports TVM); the compiling worker, GPU and RPC runners' workers always start fresh")
    children_per_server: int = Field(
        default=8, ge=1, le=1000, description='processes = "forked": children a fork server serves before it '
        "is restarted (each server is one memory layout its children share)")
    servers_ahead: bool = Field(
        default=True, description='processes = "forked": start each fork server\'s successor when the server '
        "takes its first child, so the next child need not wait for an import of TVM (only where abwatch may run "
        "on two CPUs or more)")
    tracker: str | None = Field(default=None, pattern=r"^[^:]+:\d+$", description="rpc: host:port")
    key: str | None = Field(default=None, description="rpc: device key at the tracker")
    target: dict[str, Any] | str | None = Field(
        default=None, description="TVM target, a table or a target string; default per kind (gpu: cuda; its "
        "kind picks the device API: cuda, rocm, vulkan, opencl, metal)")

    @model_validator(mode="after")
    def _rpc_needs_tracker(self) -> RunnerConfig:
        if self.kind == "rpc" and (not self.tracker or not self.key):
            raise ValueError("an rpc runner needs tracker and key")
        # "native" is resolved to this host's CPU by the runner from a table only; in a string
        # each worker's LLVM would resolve it, and one counted under Valgrind sees Valgrind's CPU
        if isinstance(self.target, str) and re.search(r"-mcpu=native\b", self.target):
            raise ValueError(f"target {self.target!r}: write a native CPU as a table, e.g. target = "
                             '{kind = "llvm", mcpu = "native"}, so every worker compiles for the same CPU')
        return self

    def measured_threads(self, asked: Threads | None, host_cpu: bool) -> int:
        """The threads a measured TVM process runs on: what its workload ``asked`` for, else
        :attr:`threads`, else one on this host's CPU (``host_cpu``) and every core elsewhere."""
        value = asked if asked is not None else self.threads
        if value == "all" or (value is None and not host_cpu):
            return os.cpu_count() or 1
        return 1 if value is None else int(value)


class SandboxConfig(StrictModel):
    """``[sandbox]``: how code under test (builds, workloads, TVM workers) is confined
    (:mod:`abwatch.builders.sandbox`)."""

    mode: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: sandbox where the host can, else warn at start; on: refuse "
        "to run without one; off: no sandbox (warned at start)")
    network: bool = Field(default=False, description="trusted workloads get the network (untrusted ones never do)")
    build_network: bool = Field(
        default=False, description="trusted builds get the host's network (whatever the host reaches, "
        "abwatch's servers included: firewall them); off, abwatch downloads what a build installs "
        "first and the build has no network; untrusted (pull-request) builds never get it")
    user: str = Field(
        default="abwatch-sandbox", min_length=1, description="the unprivileged host user code under test "
        "runs as when abwatch runs as root (never root, never abwatch's own user); made by "
        "`useradd --system --no-create-home --shell /usr/sbin/nologin abwatch-sandbox`")
    max_processes: int = Field(default=512, ge=8, description="processes (and threads) one build or one "
                               "invocation may have at once")
    max_memory_gb: float = Field(default=8.0, gt=0, description="memory one build or one invocation may "
                                 "use (a cgroup where the host has one, else each process's address space)")
    unsandboxed_untrusted: bool = Field(
        default=False, description="run untrusted (pull-request) jobs even where there is no sandbox")
    hide: list[str] = Field(default_factory=list, description="more host paths code under test must not "
                            "see (files or directories; ~ and * are expanded)")
    writable: list[str] = Field(default_factory=list, description="host paths code under test may also "
                                "write (e.g. a directory a workload leaves its results in)")
    bwrap: str = Field(default="bwrap", min_length=1, description="the bubblewrap program")


class BuildSettings(Protocol):
    """What a builder reads of the configuration (the whole ``Config`` has it)."""

    @property
    def repo(self) -> RepoConfig | None: ...

    @property
    def build(self) -> BuildConfig: ...

    @property
    def cache_dir(self) -> Path: ...

    @property
    def cache(self) -> CacheConfig: ...


class RunnerSettings(Protocol):
    """What picks a runner: the ``[runner]`` section (the whole ``Config`` has it)."""

    @property
    def runner(self) -> RunnerConfig: ...
