"""TVM end to end with the real apache-tvm wheels: builds, workers, RPC on loopback.

Every test here runs real TVM (0.26.0 and 0.27.0.post1 from PyPI, installed by the
``tvm-wheel`` builder into venvs under a session cache). The GPU runner's tests can only
check what is checkable without a GPU: this machine has none, so they check the refusal.
"""

from __future__ import annotations

import pytest
import json
import subprocess
from pathlib import Path

from sqlalchemy import select

from abwatch.builders import TvmWheelBuilder
from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig
from abwatch.service.store.models import Invocation, Record, Regression, Sample

from tests.conftest import free_port, no_nvidia

OLD, NEW = "0.26.0", "0.27.0.post1"


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def write(tmp_path, cache, workloads: str, runner: str = 'kind = "cpu"\nthreads = 1', run: str = "",
          noise_aware: bool = False) -> str:
    path = tmp_path / "tvm.toml"
    run = run or "repetitions = 4\nmax_repetitions = 4"
    if "compile_repetitions" not in run:  # compile time is judged only where a test asks for it
        run += "\ncompile_repetitions = 0"
    path.write_text(f"""
cache_dir = {json.dumps(str(cache))}
[build]
kind = "tvm-wheel"
[runner]
{runner}
[run]
{run}
seed = 3
noise_aware = {str(noise_aware).lower()}
{workloads}
""")
    return str(path)


# every sample of the 4 invocations a side that write() asks for: a workload's default batch
SAMPLES = 4 * TvmWorkloadConfig(name="x", model="builtin:mlp").samples

MLP = '''
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [1, 64]
options = {hidden = 64}
'''
MATMUL = '''
[[workloads]]
name = "matmul"
kind = "tvm"
model = "te:matmul"
options = {m = 64, k = 64, n = 64}
'''


def compare(capsys, config, db_url, control=OLD, treatment=NEW):
    code = main(["compare", "--config", config, "--control", control, "--treatment", treatment,
                 "--json", "--db", db_url])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.startswith("{") else None, captured.err


def no_workers_left(tvm_cache: Path) -> bool:
    """No TVM worker of this test session is alive. Workers run the cached build's Python, so
    ``tvm_cache`` in the command line tells them from other sessions' workers on the machine."""
    pattern = f"{tvm_cache}/.*tvm_worker.py"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout.strip() == b""


def test_release_against_release_with_complete_records(capsys, tmp_path, tvm_cache, sqlite_url):
    # the runner's threads left to the default: one a measured process on this host's CPU
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, MLP + MATMUL, runner='kind = "cpu"'), sqlite_url)
    assert code in (0, 1), err
    assert [b["sha"] for b in payload["builds"]] == [OLD, NEW]
    by_name = {r["workload"]: r for r in payload["results"]}
    assert set(by_name) == {"mlp", "matmul"}
    for result in by_name.values():
        assert result["verdict"] in ("regression", "improvement", "same", "unknown")
        assert result["control"]["n"] == result["treatment"]["n"] == SAMPLES
        assert result["compile_ms"]["control"] > 0 and result["compile_ms"]["treatment"] > 0
        assert result["error"]["mismatch"] is False and result["error"]["max_abs"] < 1e-3
        assert result["ops"], "per-operator times for both sides"
        # how contended the timing batches were (one thread: a share of at most about 1)
        assert result["contention"]["processes"] == 8 and 0 < result["contention"]["cpu_share"] <= 1.05
        assert result["stop_reason"].endswith("1 thread a process (the default: a verdict that stands on a busy host)")
    mlp_ops = {op["type"] for op in by_name["mlp"]["ops"]}
    assert "matmul" in mlp_ops
    assert all(op["control_us"] and op["treatment_us"] for op in by_name["mlp"]["ops"])
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        records = session.scalars(select(Record).where(Record.run_id == payload["run_id"])).all()
        assert len(records) == 4
        for r in records:
            assert r.engine == "tvm" and r.engine_version in (OLD, NEW)
            assert r.fields["engine_config"]["tvm_version"] == r.engine_version
            assert r.fields["metrics"]["compilation_ms"] > 0
            assert r.fields["metrics"]["ops"]
            assert r.fields["workload_args"]["model"] in ("builtin:mlp", "te:matmul")
            assert r.fields["workload_args"]["input_shapes"]
            assert r.fields["runtime_config"]["num_threads"] == "1"
            assert "llvm" in r.fields["runtime_config"]["target"]
        timed = session.scalars(select(Invocation).where(Invocation.run_id == payload["run_id"],
                                                         Invocation.warmup.is_(False))).all()
        assert len(timed) == 16
        for i in timed:  # the figures cover the timing batch, not the worker's import and compile
            assert i.cpu_s > 0 and i.involuntary_switches >= 0 and 0 < i.usage_wall_s < i.wall_s
    assert no_workers_left(tvm_cache)


def test_compile_time_is_judged_on_fresh_process_compiles(capsys, tmp_path, tvm_cache, sqlite_url):
    """0.27 compiles the MLP in about half 0.26's time: a compile-time improvement, judged on
    interleaved fresh-process compiles with the run-time statistics, shown next to run time."""
    # room for more compiles where a host is busy: the look stops as soon as the interval decides
    config = write(tmp_path, tvm_cache, MLP, run="repetitions = 4\nmax_repetitions = 4\ncompile_repetitions = 16")
    code, payload, err = compare(capsys, config, sqlite_url)
    compiled = payload["results"][0]["compile"]
    assert compiled["verdict"] == "improvement", (compiled["reason"], compiled["failure"], compiled["n"])
    assert compiled["change_pct"] < -20 and compiled["ci_pct"][1] < 0
    assert 8 <= compiled["n"][0] == compiled["n"][1] <= 16  # nothing is decided on fewer than 8 pairs
    assert len(compiled["control_ms"]) == compiled["n"][0] and min(compiled["control_ms"]) > 0
    assert compiled["stop_reason"].startswith("decided at look") and compiled.get("regression_id") is None
    assert "mlp: compile time improvement" in err
    with db.session_scope(db.make_engine(sqlite_url)) as session:
        assert session.scalars(select(Regression).where(Regression.kind == "compile-time")).all() == []
    code, payload, err = main_text(capsys, "show", payload["run_id"], "--db", sqlite_url)
    assert "mlp: compile time improvement" in payload and "fresh compiles a side" in payload
    assert no_workers_left(tvm_cache)


def test_peak_memory_and_cpu_time_of_the_run_and_the_compile(capsys, tmp_path, tvm_cache, sqlite_url):
    """A TVM workload measured by its timed processes' peak memory and CPU time too: the timing
    batch's own peak (reset before it), each fresh compile process's peak, and the batch's CPU
    time per call, each judged and stored as a row of ``measurements``."""
    workloads = MLP.replace('model = "builtin:mlp"', 'model = "builtin:mlp"\nmeasure = ["time", "max_rss", "cpu_time"]')
    config = write(tmp_path, tvm_cache, workloads, run="repetitions = 4\nmax_repetitions = 4\ncompile_repetitions = 8")
    code, payload, err = compare(capsys, config, sqlite_url)
    found = {(m["metric"], m["phase"]): m for m in payload["results"][0]["metrics"]}
    assert set(found) == {("max_rss", "runtime"), ("max_rss", "compile-time"), ("cpu_time", "runtime")}, found
    for m in found.values():
        assert m["failure"] is None and m["verdict"] in ("same", "improvement", "regression", "unknown"), m
    run, compile_ = found[("max_rss", "runtime")], found[("max_rss", "compile-time")]
    assert run["unit"] == "KiB" and run["n"] == [4, 4] and compile_["n"] == [8, 8]
    # a worker holds TVM (well over 50 MiB); a compile process peaks at least as high as its import
    assert run["control"] > 50 * 1024 and compile_["control"] > 50 * 1024
    cpu = found[("cpu_time", "runtime")]
    assert cpu["unit"] == "cpu ms" and 0 < cpu["control"] < 1000  # per call: an MLP call is well under a second
    with db.session_scope(db.make_engine(sqlite_url)) as session:
        kept = session.scalars(select(Invocation.max_rss_kb).where(Invocation.warmup.is_(False))).all()
    assert kept and all(k is not None and k > 50 * 1024 for k in kept)
    assert "mlp: max_rss (compile-time)" in err and no_workers_left(tvm_cache)


def test_a_long_sample_keeps_its_own_cpu_time_and_a_short_one_is_not_marked(capsys, tmp_path, tvm_cache, sqlite_url):
    """Each sample of a long call (builtin:mlp at batch 128: tens of ms) keeps its own CPU time,
    marked by the time evaluator in a forked child; a call of microseconds is not marked (a
    mark between two samples would cool the next one's caches by more than its size allows)."""
    wide = MLP + MLP.replace('"mlp"', '"wide"', 1).replace("[1, 64]", "[128, 256]").replace(
        "options = {hidden = 64}", "samples = 3")
    config = write(tmp_path, tvm_cache, wide, runner='kind = "cpu"\nthreads = 1\nprocesses = "forked"',
                   run="repetitions = 3\nmax_repetitions = 3")
    code, payload, err = compare(capsys, config, sqlite_url, NEW, NEW)
    assert code == 0 and {r["workload"] for r in payload["results"]} == {"mlp", "wide"}, err
    with db.session_scope(db.make_engine(sqlite_url)) as session:
        rows = session.execute(select(Invocation.workload_id, Invocation.id, Invocation.cpu_s, Sample.runtime_ms,
                                      Sample.cpu_ms).join(Sample, Sample.invocation_id == Invocation.id)
                               .where(Invocation.warmup.is_(False))).all()
    ids = {r["workload"]: r["workload_id"] for r in payload["results"]}
    short = [r for r in rows if r.workload_id == ids["mlp"]]
    assert short and all(r.cpu_ms is None for r in short)
    long = [r for r in rows if r.workload_id == ids["wide"]]
    assert len(long) == 2 * 3 * 3  # two sides, three processes, three samples
    for invocation in {r.id for r in long}:
        samples = [r for r in long if r.id == invocation]
        # within its batch's CPU time, and never above its wall time by more than the clock's slack
        assert all(r.cpu_ms is not None and 1.0 < r.cpu_ms < r.runtime_ms * 1.2 + 1.0 for r in samples), samples
        assert sum(r.cpu_ms for r in samples) <= 1000 * samples[0].cpu_s + 1.0
    assert no_workers_left(tvm_cache)


def main_text(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_same_release_twice_is_not_a_regression(capsys, tmp_path, tvm_cache, sqlite_url):
    config = write(tmp_path, tvm_cache, MLP, run="repetitions = 4\nmax_repetitions = 4\ncompile_repetitions = 8")
    code, payload, _ = compare(capsys, config, sqlite_url, NEW, NEW)
    result = payload["results"][0]
    assert result["verdict"] != "regression" and result["regression_id"] is None
    assert result["compile"]["verdict"] in ("same", "unknown") and result["compile"]["n"] == [8, 8]
    assert result["error"]["max_abs"] == 0.0  # the same build computes the same bits
    assert all(b["cached"] for b in payload["builds"])


def test_compile_failure_in_one_build_is_that_builds_failure(capsys, tmp_path, tvm_cache, sqlite_url):
    workload = '''
[[workloads]]
name = "block"
kind = "tvm"
model = "builtin:transformer"
input_shape = [1, 8, 32]
treatment_options = {options = {heads = 3}}   # 32 is not divisible by 3: reshape fails
'''
    code, payload, _ = compare(capsys, write(tmp_path, tvm_cache, workload), sqlite_url)
    assert code == 4 and payload["status"] == "incomplete"  # could not be judged: not "fine", not "slower"
    result = payload["results"][0]
    assert result["verdict"] == "unknown" and result["regression_id"] is None
    assert "treatment" in result["failure"] and "compile failed" in result["failure"]
    assert no_workers_left(tvm_cache)


def test_a_worker_that_dies_at_start_says_why_even_when_its_stderr_is_read_late(tmp_path, tvm_cache,
                                                                               monkeypatch):
    """A worker's last words (why it failed) come just before it exits; on a busy host the
    thread reading its stderr may not have them yet when its stdout ends. The failure waits for
    them. The dying build is a stand-in, said so: a hard-linked copy of the wheel's venv whose
    ``sitecustomize`` says why and exits; the late reader, a reading thread held back a second."""
    import time

    from abwatch.builders.spec import RunnerConfig
    from abwatch.runners import CpuRunner
    from abwatch.runners.worker_process import Worker

    workload = TvmWorkloadConfig(name="mlp", model="builtin:mlp", input_shape=[1, 64], samples=5)
    artifact = TvmWheelBuilder(Config(build=TvmWheelBuildConfig(), cache_dir=tvm_cache,
                                      workloads=[workload])).build(NEW).path
    dying = tmp_path / artifact.name
    subprocess.run(["cp", "-al", str(artifact), str(dying)], check=True)
    (site,) = dying.glob("lib/python3*/site-packages")
    (site / "sitecustomize.py").write_text("import sys\nsys.exit('this build cannot start: libfoo.so is missing')\n")
    tmp_path.chmod(0o755)  # the sandbox's user runs the copy
    drain = Worker._drain
    monkeypatch.setattr(Worker, "_drain", lambda self: (time.sleep(1.0), drain(self)))
    runner = CpuRunner(RunnerConfig(threads=1))
    try:
        result = runner.run(dying, workload, 120, "control")
    finally:
        runner.teardown()
    assert result.status == "error" and result.message.startswith("worker exited with status 1: "), result.message
    assert result.message.endswith("this build cannot start: libfoo.so is missing"), result.message


def test_hung_worker_is_killed_and_not_a_regression(capsys, tmp_path, tvm_cache, sqlite_url):
    slow = '''
[[workloads]]
name = "slow"
kind = "tvm"
model = "te:matmul"
options = {m = 1024, k = 1024, n = 1024}
number = 200
timeout_s = 2
'''
    code, payload, _ = compare(capsys, write(tmp_path, tvm_cache, slow), sqlite_url, NEW, NEW)
    assert code == 4 and payload["status"] == "incomplete"
    result = payload["results"][0]
    assert result["verdict"] == "unknown" and "timeout" in result["failure"]
    assert no_workers_left(tvm_cache)


def test_changed_outputs_are_a_correctness_regression(capsys, tmp_path, tvm_cache, sqlite_url):
    workload = MLP + 'treatment_options = {dtype = "float16"}\n'
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, workload), sqlite_url, NEW, NEW)
    assert code == 1, err
    result = payload["results"][0]
    assert result["error"]["mismatch"] is True and result["error"]["max_abs"] > 0
    assert result["correctness_regression_id"] is not None
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        regression = session.get(Regression, result["correctness_regression_id"])
        assert regression.kind == "correctness" and regression.state.value == "benchmark"
        reason = regression.events[0].reason
        assert "outputs differ: max abs error" in reason and "{" not in reason  # words, not a dict


def test_a_treatment_input_shape_is_what_its_treatment_worker_runs(capsys, tmp_path, tvm_cache, sqlite_url):
    """``treatment_options = {input_shape = ...}`` (a larger batch: only the outer dimension
    grows, the kernels' inner loops stay as they are) reaches the treatment's worker alone."""
    workload = MLP + "treatment_options = {input_shape = [64, 64]}\n"
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, workload), sqlite_url, NEW, NEW)
    result = payload["results"][0]
    assert result["failure"] is None, err
    assert result["error"]["reason"] == "output shape [64, 10] != [1, 10]", result["error"]
    # 64 rows, not 1 (four pairs are too few for a verdict; the medians say it)
    assert result["treatment"]["median_ms"] > 5 * result["control"]["median_ms"], result


def test_a_learnt_samples_count_is_what_the_next_run_takes(capsys, tmp_path, tvm_cache, sqlite_url):
    """The samples a process, chosen from a run's variance components (each process's fastest
    of its first n samples against what a process costs: service/stats/repetitions.py), are
    what the next run's processes take, said in the report; every RECHECK-th learnt run takes
    the workload's own count again; a config that sets ``samples`` keeps it."""
    from abwatch.service.compare import noise
    from abwatch.service.store.models import NoiseProfile, Sample

    def config(workload: str) -> str:
        return write(tmp_path, tvm_cache, workload, runner='kind = "cpu"\nthreads = 1\nprocesses = "forked"',
                     run="repetitions = 6\nmax_repetitions = 6", noise_aware=True)

    def per_process(run_id: int) -> set[int]:
        with db.session_scope(engine) as session:
            counts: dict[int, int] = {}
            for invocation in session.scalars(select(Sample.invocation_id).where(Sample.run_id == run_id,
                                                                                 Sample.warmup.is_(False))):
                counts[invocation] = counts.get(invocation, 0) + 1
            return set(counts.values())

    code, first, err = compare(capsys, config(MATMUL), sqlite_url, NEW, NEW)
    assert code in (0, 4) and first["results"][0]["failure"] is None, err
    engine = db.make_engine(sqlite_url)
    assert per_process(first["run_id"]) == {100}
    with db.session_scope(engine) as session:
        samples: dict[str, list[float]] = {"control": [], "treatment": []}
        groups: dict[str, list[int]] = {"control": [], "treatment": []}
        for row in session.scalars(select(Sample).where(Sample.run_id == first["run_id"], Sample.warmup.is_(False))
                                   .order_by(Sample.id)):
            samples[row.side.value].append(row.runtime_ms)
            groups[row.side.value].append(row.invocation_id)
        workload_id = first["results"][0]["workload_id"]
        choice = noise.choose_samples(session, first["run_id"], workload_id, samples, groups, 100)
        assert choice is not None and {5, 10, 20, 50, 100} <= {o.samples for o in choice.options}
        assert all(o.seconds > 0 and o.process_cv >= 0 for o in choice.options), choice
        assert "samples a process (" in choice.reason
        assert noise.choose_samples(session, first["run_id"], workload_id, samples, groups, 50) is None  # not 50 each
        # learnt whatever the machine's load made of the first run's verdict (`unknown` included)
        profile = session.scalars(select(NoiseProfile)).one()
        assert profile.lessons == 1 and profile.samples in {o.samples for o in choice.options}, profile
        assert (profile.process_cv is not None) == (first["results"][0]["verdict"] == "same")  # noise: `same` only
        profile.samples, profile.samples_reason, profile.lessons = 10, "10 samples a process (chosen)", 1

    code, second, err = compare(capsys, config(MATMUL), sqlite_url, NEW, NEW)
    assert per_process(second["run_id"]) == {10}
    assert "10 samples a process (chosen), learnt from 1 past run(s)" in err
    assert "10 samples a process (chosen)" in second["results"][0]["stop_reason"]
    assert second["results"][0]["workload_id"] == workload_id  # the same series

    with db.session_scope(engine) as session:
        session.scalars(select(NoiseProfile)).one().lessons = noise.RECHECK
    code, third, err = compare(capsys, config(MATMUL), sqlite_url, NEW, NEW)
    assert per_process(third["run_id"]) == {100} and "re-learns the count; last learnt 10" in err

    with db.session_scope(engine) as session:
        session.scalars(select(NoiseProfile)).one().lessons = 1
    code, fourth, err = compare(capsys, config(MATMUL + "samples = 100\n"), sqlite_url, NEW, NEW)
    assert per_process(fourth["run_id"]) == {100} and "samples a process" not in err


def test_unknown_release_is_a_clear_error(capsys, tmp_path, tvm_cache, sqlite_url):
    code, _, err = compare(capsys, write(tmp_path, tvm_cache, MLP), sqlite_url, "0.9.9", NEW)
    assert code == 2 and "unknown apache-tvm version '0.9.9'" in err


@no_nvidia
def test_gpu_runner_refuses_without_a_gpu(capsys, tmp_path, tvm_cache, sqlite_url):
    """This machine has no GPU: all that can be checked is the clear refusal."""
    code, _, err = compare(capsys, write(tmp_path, tvm_cache, MLP, runner='kind = "gpu"'), sqlite_url)
    assert code == 2 and "no cuda device on this machine" in err


def test_rpc_ab_through_a_real_tracker_on_loopback(capsys, tmp_path, tvm_cache, sqlite_url, rpc_board):
    tracker, procs = rpc_board
    runner = f'kind = "rpc"\ntracker = "{tracker}"\nkey = "local-cpu"'
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, MATMUL, runner=runner), sqlite_url)
    assert code in (0, 1), err
    result = payload["results"][0]
    assert result["failure"] is None, result
    assert result["control"]["n"] == result["treatment"]["n"] == SAMPLES
    assert result["error"]["mismatch"] is False
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        hardware = {r.hardware for r in session.scalars(select(Record).where(Record.run_id == payload["run_id"]))}
        assert hardware == {"local-cpu"}
    assert no_workers_left(tvm_cache)
    assert all(p.poll() is None for p in procs)  # the board is still up for the next user


def test_a_relax_model_over_rpc_has_per_operator_times_from_the_board(capsys, tmp_path, tvm_cache, sqlite_url, rpc_board):
    """builtin:mlp on a loopback board: each kernel timed on the board (runners/worker/ops.py),
    stored per run like the local CPU's table; the treatment widens only the last layer
    (10 -> 2000 classes), and the attribution puts that layer's kernels first."""
    tracker, procs = rpc_board
    runner = f'kind = "rpc"\ntracker = "{tracker}"\nkey = "local-cpu"'
    workload = MLP + "treatment_options = {options = {classes = 2000}}\n"
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, workload, runner=runner), sqlite_url, NEW, NEW)
    assert code in (0, 1), err
    result = payload["results"][0]
    assert result["failure"] is None, result
    ops = result["ops"]
    assert len(ops) > 1 and all(op["control_us"] > 0 and op["treatment_us"] > 0 for op in ops), ops
    assert "matmul" in {op["type"] for op in ops}
    # the widened layer (its weight is 64x2000 on the treatment side) explains most of the change
    top = ops[0]
    assert any(2000 in shape for shape in top["shapes"]), ops
    assert top["share_pct"] > 30 and top["treatment_us"] > 5 * top["control_us"], top
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        records = session.scalars(select(Record).where(Record.run_id == payload["run_id"])).all()
        assert len(records) == 2
        for record in records:  # what a run page and the profiles read
            measured = record.fields["metrics"]["ops"]
            assert len(measured) > 1 and all(us > 0 for us in measured.values()), measured
            assert set(record.fields["metrics"]["op_features"]) == set(measured)
    # the text report shows the table too (outputs of different shapes give no error figures)
    assert main(["show", str(payload["run_id"]), "--ops", "--db", sqlite_url]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # as one line, however the console wrapped it
    assert "mlp: operators" in shown and top["name"] in shown and "output shape [1, 2000] != [1, 10]" in shown
    assert no_workers_left(tvm_cache)
    assert all(p.poll() is None for p in procs)


def test_rpc_runner_with_no_tracker_is_a_clear_error(capsys, tmp_path, tvm_cache, sqlite_url):
    runner = f'kind = "rpc"\ntracker = "127.0.0.1:{free_port()}"\nkey = "local-cpu"'
    code, _, err = compare(capsys, write(tmp_path, tvm_cache, MLP, runner=runner), sqlite_url)
    assert code == 2 and "is not reachable" in err


ONNX_MODEL = """
import onnx, sys
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], [0.01 * i for i in range(256)])
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "tiny", [x], [y], [w])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
"""


def test_onnx_model_by_path_with_md5(capsys, tmp_path, tvm_cache, sqlite_url):
    import hashlib

    config = Config(build=TvmWheelBuildConfig(packages=["onnx"]), cache_dir=tvm_cache,
                    workloads=[TvmWorkloadConfig(name="x", model="builtin:mlp")])
    python = str(TvmWheelBuilder(config).build(NEW).path / "bin" / "python")
    model = tmp_path / "tiny.onnx"
    subprocess.run([python, "-c", ONNX_MODEL, str(model)], check=True)
    md5 = hashlib.md5(model.read_bytes()).hexdigest()
    workload = f'[[workloads]]\nname = "tiny"\nkind = "tvm"\nmodel = "onnx:{model}"\nmd5 = "{md5}"\n'
    path = write(tmp_path, tvm_cache, workload)
    text = Path(path).read_text().replace('kind = "tvm-wheel"', 'kind = "tvm-wheel"\npackages = ["onnx"]')
    Path(path).write_text(text)
    code, payload, err = compare(capsys, path, sqlite_url, NEW, NEW)
    result = payload["results"][0]
    assert result["failure"] is None, result
    assert result["control"]["n"] == SAMPLES and result["error"]["max_abs"] == 0.0
    assert any(op["type"].startswith("matmul") or "matmul" in op["name"] for op in result["ops"])

    Path(path).write_text(text.replace(md5, "0" * 32))
    code, payload, err = compare(capsys, path, sqlite_url, NEW, NEW)
    assert "md5 is " + md5 in payload["results"][0]["failure"]
    assert payload["results"][0]["regression_id"] is None


def test_resnet18_transformer_and_conv2d_compile_and_run(capsys, tmp_path, tvm_cache, sqlite_url):
    workloads = '''
[[workloads]]
name = "resnet18"
kind = "tvm"
model = "builtin:resnet18"
input_shape = [1, 3, 32, 32]     # small input: CPU runs stay short
number = 1
samples = 2
[[workloads]]
name = "block"
kind = "tvm"
model = "builtin:transformer"
input_shape = [1, 8, 32]
[[workloads]]
name = "conv"
kind = "tvm"
model = "te:conv2d"
input_shape = [1, 8, 16, 16]
options = {out_channels = 8}
'''
    code, payload, err = compare(capsys, write(tmp_path, tvm_cache, workloads, run="repetitions = 2\nmax_repetitions = 2"),
                                 sqlite_url, NEW, NEW)
    by_name = {r["workload"]: r for r in payload["results"]}
    assert all(r["failure"] is None for r in by_name.values()), by_name
    assert sum(op["type"] == "conv2d" for op in by_name["resnet18"]["ops"]) >= 5
    assert any("attention" in op["name"] or "matmul" in op["name"] for op in by_name["block"]["ops"])
    assert [op["name"] for op in by_name["conv"]["ops"]] == ["conv2d"]
    # operators keep what TVM says about them, so attribution can name them precisely
    assert by_name["conv"]["ops"][0]["features"] == "conv2d 1x8x16x16 float32"
    convs = [op for op in by_name["resnet18"]["ops"] if op["type"] == "conv2d"]
    assert all(op["shapes"] and op["dtypes"][0] == "float32" and op["threads"] == "1" for op in convs)
    # the table keeps the 20 operators that moved most (in an A/A run: by noise), so any may be cut;
    # each kept one names its input as TVM gave it: batch 1, one of ResNet-18's widths, halving sizes
    shapes = {(c, h) for c, h in ((3, 32), (64, 16), (64, 8), (128, 8), (128, 4), (256, 4), (256, 2), (512, 2),
                                  (512, 1), (64, 32), (128, 16), (256, 8), (512, 4))}
    assert all(op["features"] in {f"conv2d 1x{c}x{h}x{h} float32" for c, h in shapes} for op in convs), \
        [op["features"] for op in convs]
    assert by_name["conv"]["compile_ms"]["control"] > 0
