"""Every kind of plug-in is found, and its config validated, through one registry
(core/plugins.py): a toy of each kind registered here is accepted by the config, an unknown
name is refused with the known ones listed, and the registry is as it was after each test."""

from __future__ import annotations

import enum
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.builders.registry import BUILDERS
from abwatch.builders.spec import BUILD_KINDS, BuildSpec, RunnerConfig
from abwatch.builders.tvm_source import built_backends
from abwatch.builders.workload_spec import MODEL_SOURCES, ModelSource, WorkloadSpec
from abwatch.core.device_backends import DEVICE_BACKENDS, DeviceBackend
from abwatch.core.metric_names import METRIC_NAMES, Metric
from abwatch.core.plugins import Registry, UnknownName
from abwatch.runners import RUNNERS, CpuRunner, WorkloadKind, make_runner
from abwatch.runners.counters import COUNTERS, InstructionCounter, choose
from abwatch.runners.device_apis import DEVICE_APIS, DeviceApi, api_of
from abwatch.runners.worker_process import WORKER_DIR
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.service.config import (
    CONTROL_FORMS, AlertsConfig, Config, ControlForm, WatchConfig, format_validation_error,
)
from abwatch.service.compare import metrics
from abwatch.service.compare.metric_base import MetricKind
from abwatch.service.compare.metrics import METRICS
from abwatch.service.compare.outcome import MetricResult
from abwatch.service.notify import alerts
from abwatch.service.notify.channels import AlertChannel, Destinations, Sender
from abwatch.service.store import db
from abwatch.service.stats.exact import compare_exact
from abwatch.service.store.models import AlertDelivery, DeliveryStatus, Job, JobStatus, utcnow
from abwatch.service.watch import daemon, job_kinds, queue
from abwatch.service.watch.controls import CONTROL_RULES, Previous, control_rule
from abwatch.service.watch.job_kinds import JOB_KINDS, JobKind
from abwatch.service.watch.pulls import Command, CommandError
from abwatch.service.web import pull_commands
from abwatch.service.web.pull_commands import COMMANDS, Asked, PullCommand, parse_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def plug():
    """``plug(registry, name, entry)``: ``entry`` registered for the test, the registry
    restored after it."""
    undo = []

    def add(registry: Registry[Any], name: str, entry: Any) -> Any:
        context = registry.registered(name, entry)
        context.__enter__()
        undo.append(context)
        return entry

    yield add
    for context in reversed(undo):
        context.__exit__(None, None, None)


def config(tmp_path: Path, **sections: Any) -> Config:
    data = {"repo": {"url": str(tmp_path)}, "build": {"command": ["true"]},
            "workloads": [{"name": "w", "command": ["true"]}], **sections}
    return Config.model_validate(data)


def refusal(tmp_path: Path, **sections: Any) -> str:
    with pytest.raises(ValidationError) as info:
        config(tmp_path, **sections)
    return format_validation_error("abwatch.toml", info.value, Config)


# --- the registry itself ---------------------------------------------------------------------

def test_a_registry_names_what_it_has_and_the_nearest_name():
    registry: Registry[int] = Registry("gadget", [("alpha", 1), ("beta", 2)])
    assert registry.names() == ("alpha", "beta") and list(registry) == ["alpha", "beta"] and len(registry) == 2
    assert registry["beta"] == 2 and "alpha" in registry and registry.get("gamma", None) is None
    with pytest.raises(UnknownName) as info:
        registry.get("alpah")
    assert str(info.value) == "unknown gadget 'alpah'; expected one of 'alpha', 'beta' (did you mean 'alpha'?)"
    with pytest.raises(KeyError):  # UnknownName is a KeyError
        registry["zzz"]
    with pytest.raises(ValueError, match="registered already"):
        registry.register("alpha", 3)
    with registry.registered("gamma", 3):
        assert registry["gamma"] == 3
    assert registry.names() == ("alpha", "beta")  # as it was


def test_a_registry_of_another_takes_only_its_names():
    names: Registry[None] = Registry("colour", [("red", None)])
    paint: Registry[str] = Registry("paint", [("red", "#f00")], of=names)
    with pytest.raises(ValueError, match="unknown colour 'blue'; expected one of 'red'"):
        paint.register("blue", "#00f")
    assert paint.missing() == []
    names.register("green", None)
    assert paint.missing() == ["green"]


def worker_module(name: str):
    """A module of the worker's package (runners/worker/), loaded by its path as the worker
    loads it: abwatch never imports the worker's package, a test may read it."""
    spec = importlib.util.spec_from_file_location(f"abwatch_test_worker_{name}", WORKER_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_registered_name_has_its_implementation():
    # the registries keyed by a lower one's names: none left without an entry
    assert BUILDERS.missing() == [] and DEVICE_APIS.missing() == [] and CONTROL_RULES.missing() == []
    assert METRICS.missing() == []
    # the TVM worker's region counting, loaded apart from abwatch, knows every built-in counter
    assert COUNTERS.names() == worker_module("region").COUNTERS


# --- a toy of each kind ------------------------------------------------------------------------

class ToyBuildConfig(BuildSpec):
    kind: Literal["toy"] = "toy"
    recipe: str

    def hashed(self) -> dict[str, Any]:
        return {"kind": self.kind, "recipe": self.recipe}


class ToyBuilder:
    kind = "toy"


def test_a_toy_builder(plug, tmp_path):
    plug(BUILD_KINDS, "toy", ToyBuildConfig)
    plug(BUILDERS, "toy", ToyBuilder)
    built = config(tmp_path, build={"kind": "toy", "recipe": "bake"})
    assert type(built.build) is ToyBuildConfig and built.build.recipe == "bake"
    assert built.model_dump()["build"] == {"kind": "toy", "recipe": "bake"}  # all of its fields
    assert BUILDERS[built.build.kind] is ToyBuilder
    assert refusal(tmp_path, build={"kind": "toy"}) == "abwatch.toml: build.recipe: field required"
    assert refusal(tmp_path, build={"kind": "tyo"}) == (
        "abwatch.toml: build: unknown kind; expected one of 'command', 'tvm-wheel', 'tvm-source', 'toy' "
        "(did you mean 'toy'?)")
    with pytest.raises(ValueError, match="unknown build kind 'oven'"):  # a builder's name is a build kind's
        BUILDERS.register("oven", ToyBuilder)  # type: ignore[arg-type]


def test_each_build_kind_names_a_builder_of_its_own_kind():
    """BUILDERS is loaded from the models' ``builder`` paths: each names a class that says the
    same kind, and loading the config's models imports no builder."""
    for name, model in BUILD_KINDS.items():
        assert BUILDERS[name].kind == name and model.builder.startswith("abwatch.builders."), name
    probe = ("import sys\nfrom abwatch.service.config import load_config\n"
             "print(sorted(m for m in sys.modules if m in ('git', 'abwatch.builders.registry', "
             "'abwatch.builders.command')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class ToyRunner(CpuRunner):
    kind = "toy"


def test_a_toy_runner(plug, tmp_path):
    plug(RUNNERS, "toy", ToyRunner)
    # a TVM workload (command workloads run on the cpu runner only)
    toy = config(tmp_path, runner={"kind": "toy", "threads": 2},
                 workloads=[{"name": "t", "kind": "tvm", "model": "builtin:mlp"}])
    assert toy.runner == RunnerConfig(kind="toy", threads=2)
    assert type(make_runner(toy)) is ToyRunner
    assert refusal(tmp_path, runner={"kind": "tyo"}) == (
        "abwatch.toml: runner: unknown kind; expected one of 'cpu', 'gpu', 'rpc', 'toy' (did you mean 'toy'?)")


class ToyRule(Previous):
    name = "toy"


def test_a_toy_control_rule(plug, tmp_path):
    plug(CONTROL_FORMS, "toy", ControlForm("toy"))
    plug(CONTROL_RULES, "toy", ToyRule)
    assert type(control_rule(config(tmp_path, watch={"control": "toy"}))) is ToyRule
    assert refusal(tmp_path, watch={"control": "toy:x"}) == (
        "abwatch.toml: watch.control: value error, the toy rule takes no argument")
    assert refusal(tmp_path, watch={"control": "tyo"}) == (
        "abwatch.toml: watch.control: value error, unknown control rule 'tyo'; expected one of 'previous', "
        "'parent', 'week-start', 'fixed', 'toy' (did you mean 'toy'?)")
    with pytest.raises(ValueError, match="unknown control rule 'latest'"):  # a rule the config cannot name
        CONTROL_RULES.register("latest", ToyRule)
    WatchConfig(control="fixed:v1.0")  # the built-in rules are as they were


class ToyApi(DeviceApi):
    name = "toy"
    packages = "a toy driver"

    def devices(self) -> list[dict]:
        return [{"name": "Toy GPU", "driver": "toy 1.0", "memory_bytes": None}]


def test_a_toy_device_api(plug):
    plug(DEVICE_BACKENDS, "toy", DeviceBackend("toy", "USE_TOY"))
    plug(DEVICE_APIS, "toy", ToyApi())
    assert type(api_of({"kind": "toy"})) is ToyApi and type(api_of("toy -arch=x")) is ToyApi
    # a tvm-source build that turns its flag on asks its runtime for it (the post-build check)
    assert built_backends({"USE_TOY": "ON", "USE_CUDA": "OFF", "USE_LLVM": "ON"}) == ["toy"]
    assert built_backends({"USE_CUDA": "ON", "USE_VULKAN": "/opt/vulkan"}) == ["cuda", "vulkan"]
    with pytest.raises(ValueError) as info:
        api_of({"kind": "tyo"})
    assert str(info.value) == ("runner.target: kind 'tyo' is not a device API; expected one of "
                               "cuda, metal, opencl, rocm, toy, vulkan, webgpu")


class ToyWorkloadConfig(WorkloadSpec):
    kind: Literal["toy"] = "toy"
    samples: list[float]


class ToyKind(WorkloadKind):
    kind = "toy"
    config = ToyWorkloadConfig

    def run(self, tvm, artifact_dir, workload, timeout_s, side):
        raise NotImplementedError

    def record_fields(self, workload, worker):
        return {}, {}, {}


def test_a_toy_workload_kind(plug, tmp_path):
    plug(WORKLOAD_KINDS, "toy", ToyKind())
    toy = config(tmp_path, workloads=[{"name": "t", "kind": "toy", "samples": [1.0, 2.0]}])
    assert type(toy.workloads[0]) is ToyWorkloadConfig and toy.workloads[0].samples == [1.0, 2.0]
    assert refusal(tmp_path, workloads=[{"name": "t", "kind": "toy"}]) == (
        "abwatch.toml: workloads[0].samples: field required")
    assert refusal(tmp_path, workloads=[{"name": "t", "kind": "tyo"}]) == (
        "abwatch.toml: workloads[0]: unknown kind; expected one of 'command', 'tvm', 'toy' (did you mean 'toy'?)")


def worker_sources():
    """The worker's sources module (runners/worker/sources.py)."""
    return worker_module("sources")


def test_the_hosts_model_sources_are_the_workers():
    # what a config may write before a model's colon is what the worker can build
    sources = worker_sources()
    assert tuple(sources.SOURCES) == MODEL_SOURCES.names() == ("builtin", "te", "onnx", "script")
    assert all(issubclass(source, sources.Source) for source in sources.SOURCES.values())


def test_a_toy_model_source(plug, tmp_path, monkeypatch):
    # the host's side: the name and its models' options, validated by the config
    plug(MODEL_SOURCES, "toy", ModelSource(models={"cube": ("side",)}))
    toy = config(tmp_path, workloads=[{"name": "t", "kind": "tvm", "model": "toy:cube", "options": {"side": 3}}])
    assert toy.workloads[0].model == "toy:cube"
    assert refusal(tmp_path, workloads=[{"name": "t", "kind": "tvm", "model": "toy:cube", "options": {"edge": 3}}]) \
        == "abwatch.toml: workloads[0]: value error, options: unknown key 'edge' for toy:cube (known: side)"
    assert "unknown model 'toy:ball'" in refusal(tmp_path, workloads=[{"name": "t", "kind": "tvm", "model": "toy:ball"}])
    said = refusal(tmp_path, workloads=[{"name": "t", "kind": "tvm", "model": "tyo:cube"}])
    assert "unknown model 'tyo:cube'; did you mean 'toy:cube'?" in said and "te:matmul, toy:cube, onnx:<path>" in said
    # the worker's side: a Source subclass in its SOURCES (a worker of a build would then build
    # it; that runs in the build's Python, from the file: runners/worker/sources.py)
    sources = worker_sources()

    class Cube(sources.Source):
        def build(self, spec, rng, target):
            side = spec["options"]["side"]
            return sources.Model(None, "main", [rng.standard_normal([side] * 3)], False, out_shape=[side] * 3,
                                 operator="cube")

    monkeypatch.setitem(sources.SOURCES, "toy", Cube)
    assert tuple(sources.SOURCES) == MODEL_SOURCES.names()
    built = sources.SOURCES["toy"](lambda name: None).build({"options": {"side": 2}}, np.random.default_rng(0), None)
    assert built.inputs[0].shape == (2, 2, 2) and built.operator == "cube" and not built.is_vm
    with pytest.raises(TypeError, match="abstract"):  # a source must say how it builds
        type("Empty", (sources.Source,), {})(lambda name: None)


class ToySender(Sender):
    """Delivers by keeping the document: what a channel's sender does in place of a POST."""

    kept: list[dict] = []

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        ToySender.kept.append(self.document)
        return 200


class ToyChannel(AlertChannel):
    """Rows labelled ``toy:<room>`` go to the toy; the label names where."""

    prefix = "toy:"

    def sender(self, row, destinations, deadline):
        sender = ToySender(row.id, row.webhook, "toy://" + row.webhook.removeprefix(self.prefix), b"", {},
                           destinations.alerts, deadline)
        sender.document = row.payload
        return sender


def test_a_toy_alert_channel(plug, sqlite_url):
    plug(alerts.CHANNELS, "toy", ToyChannel())
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        now = utcnow()
        session.add(AlertDelivery(regression_id=None, event="stale", webhook="toy:kitchen", payload={"text": "hi"},
                                  status=DeliveryStatus.PENDING, attempts=0, at=now, next_at=now))
        session.commit()
    ToySender.kept.clear()
    sent = alerts.deliver_pending(engine, Destinations(AlertsConfig()))
    assert [(s.webhook, s.ok) for s in sent] == [("toy:kitchen", True)] and ToySender.kept == [{"text": "hi"}]
    with Session(engine) as session:
        assert session.scalar(select(AlertDelivery.status)) is DeliveryStatus.DELIVERED
    assert isinstance(alerts.channel_for("toy:x"), ToyChannel)
    assert isinstance(alerts.channel_for("https://hooks.example/x"), alerts.WebhookChannel)
    engine.dispose()


class Echo(PullCommand):
    """``echo WORD...``: answers with its words."""

    usage = "echo WORD..."

    def parse(self, words, usage):
        if len(words) < 2:
            raise CommandError(usage)
        return Command("echo", words=tuple(words))

    def carry_out(self, asked):
        return 200, {"said": list(asked.command.words[1:]), "pr": asked.number}


def test_a_toy_pull_request_command(plug, tmp_path):
    plug(COMMANDS, "echo", Echo())
    command = parse_command("thanks!\n@abwatch echo hello there", "@abwatch")
    assert command is not None and command.action == "echo"
    asked = Asked(None, config(tmp_path), command, 7, "someone", 1, {})
    assert COMMANDS[command.action].carry_out(asked) == (200, {"said": ["hello", "there"], "pr": 7})
    with pytest.raises(CommandError) as info:
        parse_command("@abwatch dance", "@abwatch")
    assert str(info.value) == ("usage: `@abwatch try [WORKLOAD...] [--verify]` or `@abwatch triage "
                               "acknowledged|not-a-bug|fixed-by <sha>` or `@abwatch echo WORD...`")
    assert pull_commands.usage("@abwatch").endswith("`@abwatch echo WORD...`")


class ToyName(str, enum.Enum):
    """A metric's name as ``core.metric_names.Metric`` writes one (a ``str`` enum member)."""

    TOY = "toy"


class ToyMetric(MetricKind):
    """A metric of the builds: the files each build's artifact holds, judged exactly."""

    metric, unit, default_threshold_pct = ToyName.TOY, "files", 1.0
    record_field = "toy_files"

    def measure_builds(self, control, treatment, config):
        files = [float((found or {}).get("toy_files", 1)) for found in (control, treatment)]
        verdict = compare_exact(files[0], files[1], threshold_pct=self.threshold_pct(config), unit=self.unit)
        return MetricResult(self.metric.value, "build", verdict, (files[0],), (files[1],), "toy count")

    def judged(self, result, phase):
        return result.verdict, None


def test_a_toy_metric(plug, tmp_path):
    # a metric of the builds: the registry judges it between a run's two builds (the driver's
    # ``judge_builds`` asks every metric, naming none) and reads its record field back by name.
    # Storing its rows needs its name in ``core.metric_names.Metric`` too (the store's and the
    # config's enum), which a test cannot add to: that second file is a new metric's.
    plug(METRIC_NAMES, "toy", ToyName.TOY)
    plug(METRICS, ToyName.TOY, ToyMetric())
    (toy,) = metrics.measure_builds({"toy_files": 3}, {"toy_files": 4}, config(tmp_path))
    assert (toy.metric, toy.phase, toy.verdict.verdict.value) == ("toy", "build", "regression")
    assert (toy.control_values, toy.treatment_values, toy.verdict.unit) == ((3.0,), (4.0,), "files")
    assert metrics.record_fields("treatment", [toy]) == {"toy_files": 4.0}  # found by its name, a str
    (same,) = metrics.measure_builds({"toy_files": 3}, {"toy_files": 3}, config(tmp_path))
    assert same.verdict.verdict.value == "same"
    with pytest.raises(ValueError, match="unknown metric 'tyo'; expected one of 'time', .*'toy' "):
        METRICS.register("tyo", ToyMetric())  # a metric's name is one of core.metric_names'


class ToyCounter(InstructionCounter):
    """Counts nothing: says 42, written by the wrapped command's shell."""

    name = "toy"

    def unavailable(self):
        return None

    def wrap(self, argv, scratch):
        return ["sh", "-c", f'echo 42 > {scratch}/count && exec "$@"', "toy", *argv]

    def read(self, scratch):
        return int((scratch / "count").read_text())

    def region_argv(self, argv, scratch):
        return self.wrap(argv, scratch)

    def read_region(self, scratch, reported):
        return self.read(scratch)


def test_a_toy_instruction_counter(plug, tmp_path):
    plug(COUNTERS, "toy", ToyCounter())
    toy = config(tmp_path, run={"counter": "toy"})
    counter = choose(toy.run.counter)
    assert type(counter) is ToyCounter
    subprocess.run(counter.wrap(["true"], tmp_path), check=True)
    assert counter.read(tmp_path) == 42
    assert refusal(tmp_path, run={"counter": "tyo"}) == (
        "abwatch.toml: run.counter: value error, unknown instruction counter 'tyo'; expected 'auto' or one of "
        "'perf', 'valgrind', 'toy' (did you mean 'toy'?)")
    assert config(tmp_path, run={"counter": "auto"}).run.counter == "auto"


class ToyJob(JobKind):
    """Answers with its payload's words, reversed."""

    def run(self, session, config, job, progress):
        return {"said": list(reversed(job.payload["words"])), "device": job.device}


def test_a_toy_job_kind(plug, tmp_path, sqlite_url):
    plug(JOB_KINDS, "echo", ToyJob())
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with Session(engine) as session:
        queue.enqueue(session, "echo", "toy-box", {"words": ["a", "b"]}, "echo:1")
        session.commit()
    worker = queue.Worker(engine, "toy-box", daemon.handlers(config(tmp_path)))
    assert worker.run_one() is not None and worker.run_one() is None
    with Session(engine) as session:
        job = session.scalars(select(Job)).one()
        assert (job.kind, job.status, job.result) == ("echo", JobStatus.DONE, {"said": ["b", "a"],
                                                                               "device": "toy-box"})
    # the build queue's worker runs the build kinds only, a device's worker all the others
    assert list(job_kinds.handlers(config(tmp_path), of_builds=True)) == ["build"]
    assert list(daemon.handlers(config(tmp_path))) == ["test", "try", "pr", "echo"]
    worker.close()
    engine.dispose()


def test_the_registries_are_as_they_were():
    # after the toys: each plug-in registry holds the built-in plug-ins only
    assert BUILD_KINDS.names() == BUILDERS.names() == ("command", "tvm-wheel", "tvm-source")
    assert RUNNERS.names() == ("cpu", "gpu", "rpc") and WORKLOAD_KINDS.names() == ("command", "tvm")
    assert CONTROL_RULES.names() == CONTROL_FORMS.names() == ("previous", "parent", "week-start", "fixed")
    assert DEVICE_APIS.names() == DEVICE_BACKENDS.names()
    assert alerts.CHANNELS.names() == ("github-culprit", "github-pr", "github", "webhook")
    assert COMMANDS.names() == ("try", "triage")
    assert METRICS.names() == METRIC_NAMES.names() == tuple(m.value for m in Metric)
    assert COUNTERS.names() == ("perf", "valgrind")
    assert JOB_KINDS.names() == ("test", "try", "pr", "build")
    assert MODEL_SOURCES.names() == ("builtin", "te", "onnx", "script")


# --- where a new plug-in goes ------------------------------------------------------------------

def test_the_documented_registries_are_where_the_docs_say():
    """docs/architecture.md's table names, for each kind, the file each registry is in."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    for registry, path in (("BUILD_KINDS", "builders/spec.py"), ("BUILDERS", "builders/registry.py"),
                           ("RUNNERS", "runners/__init__.py"), ("WORKLOAD_KINDS", "runners/workloads.py"),
                           ("DEVICE_BACKENDS", "core/device_backends.py"), ("DEVICE_APIS", "runners/device_apis.py"),
                           ("MODEL_SOURCES", "builders/workload_spec.py"),
                           ("CONTROL_FORMS", "service/config.py"), ("CONTROL_RULES", "service/watch/controls.py"),
                           ("CHANNELS", "service/notify/alerts.py"), ("COMMANDS", "service/web/pull_commands.py"),
                           ("METRIC_NAMES", "core/metric_names.py"), ("METRICS", "service/compare/metrics.py"),
                           ("COUNTERS", "runners/counters.py"), ("JOB_KINDS", "service/watch/job_kinds.py")):
        assert f"{registry}: Registry[" in (ROOT / path).read_text(), (registry, path)
        assert f"`{path}` (`{registry}`" in text, (registry, path)
