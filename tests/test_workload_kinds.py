"""A workload kind is one class and its entry in WORKLOAD_KINDS: its config model, its paths,
the runners that can run it, how it runs and its output check are all asked of it.

The kind below exists only in this file; registering it is all it takes for a config to use
it, for a runner to run it and for a whole comparison to measure, judge and store it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Literal

import pytest
from sqlalchemy import select

from abwatch.core.errors import UsageError
from abwatch.builders.spec import RunnerConfig
from abwatch.builders.workload_spec import CommandWorkloadConfig, TvmWorkloadConfig, WorkloadSpec
from abwatch.runners import WORKLOAD_KINDS, CpuRunner, InvocationResult, RpcRunner, WorkloadKind
from abwatch.runners.outputs import output_error
from abwatch.service.cli.main import main
from abwatch.service.config import ConfigError, load_config
from abwatch.service.store import db
from abwatch.service.store.models import Comparison, Record, Workload


class ToyWorkloadConfig(WorkloadSpec):
    """A workload whose samples are read from a file (``samples``, relative to the config)."""

    kind: Literal["toy"] = "toy"
    samples: str
    jitter: float = 0.001


class ToyKind(WorkloadKind):
    """Runs no process: each invocation reports the file's samples, jittered."""

    kind = "toy"
    config = ToyWorkloadConfig
    runners = frozenset({"cpu"})

    def __init__(self) -> None:
        self.rng = random.Random(3)

    def resolve(self, workload: ToyWorkloadConfig, base_dir: Path) -> ToyWorkloadConfig:
        path = (base_dir / workload.samples).resolve()
        if not path.is_file():
            raise UsageError(f"samples: {path} is not a file")
        return workload.model_copy(update={"samples": str(path)})

    def run(self, tvm, artifact_dir, workload: ToyWorkloadConfig, timeout_s, side) -> InvocationResult:
        values = [float(v) for v in Path(workload.samples).read_text().split()]
        return InvocationResult("ok", tuple(v * (1 + workload.jitter * self.rng.random()) for v in values), 0.01)

    def record_fields(self, workload: ToyWorkloadConfig, worker) -> tuple[dict, dict, dict]:
        return {"samples": workload.samples}, {"kind": "toy"}, {}


TOY = """
cache_dir = {cache}
[repo]
url = {repo}
[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "toy1"
kind = "toy"
samples = "inputs/samples.txt"
[run]
repetitions = 4
warmup = 0
seed = 7
noise_aware = false
max_seconds = 30
{extra}
"""


@pytest.fixture
def toy(monkeypatch):
    """The toy kind, registered for the test (the one line a new kind adds to WORKLOAD_KINDS)."""
    monkeypatch.setitem(WORKLOAD_KINDS, ToyKind.kind, ToyKind())


def write_toy(tmp_path: Path, repo: Path, extra: str = "") -> Path:
    (tmp_path / "inputs").mkdir(exist_ok=True)
    (tmp_path / "inputs" / "samples.txt").write_text("2.0 2.1 1.9 2.0\n")
    path = tmp_path / "toy.toml"
    path.write_text(TOY.format(cache=json.dumps(str(tmp_path / "cache")), repo=json.dumps(str(repo)), extra=extra))
    return path


def test_a_registered_kind_is_validated_resolved_and_run_through_the_registry(toy, tmp_path, bench_repo):
    config = load_config(write_toy(tmp_path, bench_repo))
    workload = config.workloads[0]
    assert type(workload) is ToyWorkloadConfig and workload.jitter == 0.001
    assert workload.samples == str(tmp_path / "inputs" / "samples.txt")  # against the config's directory
    result = CpuRunner(config.runner).run(tmp_path, workload, 5.0)
    assert result.status == "ok" and len(result.samples) == 4 and 1.9 <= min(result.samples) < 1.91
    # a kind without a compile step says so, by name
    with pytest.raises(NotImplementedError, match="toy workloads have no compile step to time"):
        CpuRunner(config.runner).compile_time(tmp_path, workload, 5.0)


def test_a_kinds_errors_name_the_file_the_key_and_the_runner(toy, tmp_path, bench_repo):
    path = write_toy(tmp_path, bench_repo)
    path.write_text(path.read_text().replace('samples = "inputs/samples.txt"', 'samples = "inputs/none.txt"'))
    with pytest.raises(ConfigError, match=r"toy\.toml: workloads\[0\] \(toy1\): samples: .*none\.txt is not a file"):
        load_config(path)
    path.write_text(path.read_text().replace('samples = "inputs/none.txt"', 'sample = "x"'))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "toy.toml: workloads[0].samples: field required" in str(info.value)
    assert "toy.toml: workloads[0].sample: extra inputs are not permitted" in str(info.value)
    # a runner the kind does not run on is refused when the config is read, naming both
    path = write_toy(tmp_path, bench_repo, extra='[runner]\nkind = "gpu"')
    with pytest.raises(ConfigError, match="workload 'toy1': the gpu runner cannot run toy workloads "
                                          r"\(they run on: cpu\)"):
        load_config(path)


def test_an_incompatible_runner_handed_to_a_comparison_refuses_the_workload(toy, tmp_path, bench_repo):
    # the config's own runner was checked when it was read; a runner given by the caller is
    # checked as it runs each workload
    workload = load_config(write_toy(tmp_path, bench_repo)).workloads[0]
    rpc = RpcRunner(RunnerConfig(kind="rpc", tracker="127.0.0.1:9", key="board"))
    with pytest.raises(UsageError, match="workload 'toy1': the rpc runner cannot run toy workloads"):
        rpc.run(tmp_path, workload, 5.0)
    with pytest.raises(UsageError, match="workload 'w': the rpc runner cannot run command workloads"):
        rpc.run(tmp_path, CommandWorkloadConfig(name="w", command=["true"]), 5.0)


def test_an_unregistered_kind_is_an_error_naming_the_known_ones(tmp_path, bench_repo):
    with pytest.raises(ConfigError) as info:
        load_config(write_toy(tmp_path, bench_repo))
    assert "toy.toml: workloads[0]: unknown kind; expected one of 'command', 'tvm'" in str(info.value)


def test_the_registry_names_each_kind_by_its_models_kind():
    for name, kind in WORKLOAD_KINDS.items():
        assert kind.kind == name and kind.config.model_fields["kind"].default == name
    assert WORKLOAD_KINDS["command"].config is CommandWorkloadConfig
    assert WORKLOAD_KINDS["tvm"].config is TvmWorkloadConfig
    # a kind that compares no outputs has no correctness check
    assert WORKLOAD_KINDS["command"].check_outputs(CommandWorkloadConfig(name="w", command=["true"]), {}) is None


def test_the_tvm_kinds_output_check_uses_the_workloads_tolerance():
    import base64

    import numpy as np

    def tensor(values) -> dict:
        array = np.asarray(values, dtype="float32")
        return {"shape": list(array.shape), "dtype": "float32", "data": base64.b64encode(array.tobytes()).decode()}

    def metrics(control, treatment) -> dict:
        return {"control": [{"outputs": tensor(control)}], "treatment": [{}, {"outputs": tensor(treatment)}]}

    tvm = WORKLOAD_KINDS["tvm"]
    loose = TvmWorkloadConfig(name="m", model="builtin:mlp", rtol=0.1, atol=0.0)
    tight = TvmWorkloadConfig(name="m", model="builtin:mlp", rtol=1e-4, atol=0.0)
    assert tvm.check_outputs(loose, metrics([1.0, 2.0], [1.01, 2.0]))["mismatch"] is False
    diff = tvm.check_outputs(tight, metrics([1.0, 2.0], [1.01, 2.0]))
    assert diff["mismatch"] is True and diff["rtol"] == 1e-4 and diff["max_rel"] == pytest.approx(0.01, rel=1e-3)
    assert tvm.check_outputs(tight, {"control": [{}], "treatment": [{}]}) is None  # nothing compiled: no check
    assert output_error(tensor([1.0]), tensor([1.0, 2.0]), 0.1, 0.1)["reason"] == "output shape [2] != [1]"


def test_a_comparison_measures_judges_and_records_a_registered_kind(toy, tmp_path, bench_repo, capsys, sqlite_url):
    url = sqlite_url
    config = write_toy(tmp_path, bench_repo)
    code = main(["compare", "--config", str(config), "--control", "base", "--treatment", "noop", "--json",
                 "--db", url])
    result = json.loads(capsys.readouterr().out)["results"][0]
    assert code == 0 and result["workload"] == "toy1" and result["verdict"] in ("same", "unknown"), result
    with db.session_scope(db.make_engine(url)) as session:
        workload = session.scalars(select(Workload)).one()
        assert (workload.name, workload.kind, workload.spec["samples"]) == (
            "toy1", "toy", str(tmp_path / "inputs" / "samples.txt"))
        comparison = session.scalars(select(Comparison)).one()
        assert comparison.control_n >= 4 and "error" not in (comparison.details or {})  # no output check
        records = session.scalars(select(Record)).all()  # what the kind's record_fields said
        assert sorted(r.side.value for r in records) == ["control", "treatment"]
        assert all('"kind": "toy"' in json.dumps(r.fields) for r in records), records[0].fields
