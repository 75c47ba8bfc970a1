"""Timed TVM workers forked from per-build, per-side fork servers (``[runner] processes =
"forked"``), with the real apache-tvm wheel: each child a process of its own with its own
samples, servers restarted after their share of children, and a comparison through them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from abwatch.builders import TvmWheelBuilder
from abwatch.builders.spec import RunnerConfig
from abwatch.runners import CpuRunner
from abwatch.runners.fork_servers import prestarts
from abwatch.service.cli.main import main
from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig
from abwatch.service.store import db
from abwatch.service.store.models import Comparison, Invocation

pytestmark = pytest.mark.slow  # real TVM processes (each test ~10-20 s on 2 busy cores)

NEW = "0.27.0.post1"
MLP = TvmWorkloadConfig(name="mlp", model="builtin:mlp", input_shape=[1, 64], options={"hidden": 64}, samples=20)
# a small model that generates tokens (tests/test_llm_decode.py's): compiles in seconds
LLM = TvmWorkloadConfig(name="llm", model="builtin:llm-decode", samples=5, options={
    "layers": 2, "hidden": 64, "heads": 4, "prompt_tokens": 16, "decode_steps": 8, "vocab": 256})
COMPILER = {"libtvm.so", "libtvm_compiler.so"}  # TVM's compiler library, as source builds and wheels name it


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def artifact(tvm_cache):
    config = Config(build=TvmWheelBuildConfig(), cache_dir=tvm_cache, workloads=[MLP])
    return TvmWheelBuilder(config).build(NEW).path


def test_forked_children_are_processes_of_their_own_and_servers_restart(artifact):
    runner = CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=2))
    servers: list[int] = []  # the live server's pid after each child
    pads: dict[int, int] = {}  # each server's environment padding (the sandbox's process holds it)
    libraries: dict[int, tuple[str, ...]] = {}  # the TVM libraries each server mapped
    try:
        first = runner.run(artifact, MLP, 120, "control")  # compiles and exports: a fresh worker
        assert first.status == "ok" and first.server is None and first.metrics["compile_ms"] > 0
        children = []
        asked: list[float] = []  # when each child was asked for
        for _ in range(5):
            asked.append(time.monotonic())
            child = runner.run(artifact, MLP, 120, "control")
            assert child.status == "ok", child.message
            children.append(child)
            if len(children) == 1:  # the first server's successor started when it took its first child
                (ahead,) = runner.tvm.timed.successors.values()
                successor = ahead.result(timeout=300)
            live = runner.tvm.timed.live
            servers.append(next(iter(live.values())).pid if live else 0)
            libraries.update({s.pid: s.libraries for s in live.values()})
            if servers[-1]:
                environ = Path(f"/proc/{servers[-1]}/environ").read_bytes().split(b"\0")
                (pad,) = [v for v in environ if v.startswith(b"ABWATCH_LAYOUT_PAD=")]
                pads[servers[-1]] = len(pad) - len("ABWATCH_LAYOUT_PAD=")
        other = runner.run(artifact, MLP, 120, "treatment")  # its own side's compile, then its own server
        treated = runner.run(artifact, MLP, 120, "treatment")
        # a workload on two threads is forked from a server started with them, not from the one-thread one
        two = MLP.model_copy(update={"name": "mlp2", "threads": 2})
        assert runner.run(artifact, two, 120, "control").status == "ok"  # compiles (fresh)
        on_two = runner.run(artifact, two, 120, "control")
        (server_of_two,) = [s for key, s in runner.tvm.timed.live.items() if ("TVM_NUM_THREADS", "2") in key[2]]
        environ = Path(f"/proc/{server_of_two.pid}/environ").read_bytes().split(b"\0")
    finally:
        runner.teardown()
    # every child timed its own batch: its samples, its usage figures, its process
    assert all(len(c.samples) == 20 and c.cpu_s and c.usage_wall_s for c in children)
    # on the inputs the compiling worker saved, through TVM's runtime library alone: the same
    # operators on the same shapes as the compiling worker's, from servers without the compiler
    assert all(c.metrics["op_features"] == first.metrics["op_features"] for c in children)
    assert libraries and all("libtvm_runtime.so" in names and not COMPILER & set(names)
                             for names in libraries.values()), libraries
    assert len({c.samples for c in children}) == 5
    assert [c.server for c in children] == [0, 0, 1, 1, 2]  # two children a server, then a new one
    # each server after the first was started ahead, before its first child was asked for
    assert successor.index == 1 and successor.began < asked[2], (successor.began, asked)
    # a server's first child says how long its server took to start; its later children do not
    assert [c.server_start_s is not None for c in children] == [True, False, True, False, True]
    assert all(c.server_start_s > 0.05 for c in children[::2]), children  # an interpreter and import tvm
    # within a server (a pid namespace of its own under the sandbox) each child has a pid of its own
    assert len({(c.server, c.pid) for c in children}) == 5 and all(c.pid for c in children)
    # the server lived for its two children, was closed after them and replaced by a new process
    assert servers[0] and servers[1] == 0 and servers[2] and servers[2] != servers[0] and servers[3] == 0
    assert not alive(servers[0]) and not alive(servers[2])
    assert len(pads) == 3 and all(0 <= n < 4096 for n in pads.values())
    assert len(set(pads.values())) > 1  # drawn per server (all three alike: once in 16 million runs)
    # the treatment side is never served by control's (3: control's third server's successor)
    assert other.server is None and treated.server == 4
    assert not runner.tvm.timed.live and not runner.tvm.timed.successors  # teardown stops the servers
    assert not alive(successor.pid)
    assert on_two.status == "ok" and on_two.threads == 2 and on_two.server == server_of_two.index
    assert b"TVM_NUM_THREADS=2" in environ and on_two.server not in [c.server for c in children]


def test_a_failing_or_hung_child_takes_its_server_down_and_the_next_gets_a_new_one(artifact):
    # made on one CPU: its servers start no successors ahead (their import would take the child's CPU)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        assert not prestarts()
        runner = CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=5))
    finally:
        os.sched_setaffinity(0, cpus)
    assert prestarts() == (len(cpus) >= 2) and not runner.tvm.timed.prestart
    # and where the runner says so (servers_ahead = false), on any number of CPUs
    assert not CpuRunner(RunnerConfig(processes="forked", servers_ahead=False)).tvm.timed.prestart
    try:
        assert runner.run(artifact, MLP, 120, "control").status == "ok"
        assert runner.run(artifact, MLP, 120, "control").server == 0
        (server,) = runner.tvm.timed.live.values()
        runner.tvm._lib(artifact, MLP, "control").unlink()  # what the next child loads is gone
        failed = runner.run(artifact, MLP, 120, "control")
        assert failed.status == "error" and "failed" in failed.message and failed.server is None, failed
        assert not runner.tvm.timed.live and not alive(server.pid)
        # tried on the runtime library alone (server 0), then again with the compiler (server 1)
        assert list(runner.tvm.runtime_refused) == [MLP.name] and runner.tvm.timed.started == 2
        # a child past its time limit is killed with its server, and the next child has a new one
        other = MLP.model_copy(update={"name": "mlp2"})  # a workload not refused: runtime-only servers
        assert runner.run(artifact, other, 120, "treatment").status == "ok"  # compiles the treatment's
        assert runner.run(artifact, other, 120, "treatment").server == 2
        (server,) = runner.tvm.timed.live.values()
        hung = runner.run(artifact, other, 0.001, "treatment")
        assert hung.status == "timeout" and "killed after" in hung.message, hung
        assert not runner.tvm.timed.live and not alive(server.pid)
        # a hung child is the workload's: not run again with the compiler
        assert runner.tvm.timed.started == 3 and other.name not in runner.tvm.runtime_refused
        after = runner.run(artifact, other, 120, "treatment")
        assert after.status == "ok" and after.server == 3
        (server,) = runner.tvm.timed.live.values()
        assert not COMPILER & set(server.libraries)
        assert not runner.tvm.timed.successors
    finally:
        runner.teardown()


def test_a_generating_model_forked_from_a_runtime_only_server_times_its_generations(artifact):
    """A model that generates tokens: its children load the prompt, the decode steps' tokens
    and the weights the compiling worker saved, and time generations through the runtime's VM."""
    runner = CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=2))
    try:
        first = runner.run(artifact, LLM, 300, "control")
        assert first.status == "ok", first.message
        child = runner.run(artifact, LLM, 300, "control")
        (server,) = runner.tvm.timed.live.values()
    finally:
        runner.teardown()
    assert child.status == "ok" and child.server == 0, child.message
    assert "libtvm_runtime.so" in server.libraries and not COMPILER & set(server.libraries)
    assert set(child.series) == set(first.series) and all(len(v) == 5 for v in child.series.values())
    # each generation ran the saved eight decode steps: tokens a second times the decode's time
    for sample, ttft, tokens_per_s in zip(child.samples, child.series["ttft"], child.series["tokens_per_s"],
                                          strict=True):
        assert round(tokens_per_s * (sample - ttft) / 1000) == 8


@pytest.fixture
def broken(artifact, tmp_path) -> Path:
    """A build that fails to start with ``TVM_USE_RUNTIME_LIB=1`` (a stand-in: a copy of the
    wheel's venv whose interpreter refuses to start so)."""
    copy = tmp_path / artifact.name
    subprocess.run(["cp", "-al", str(artifact), str(copy)], check=True)
    (site,) = copy.glob("lib/python3*/site-packages")
    (site / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('TVM_USE_RUNTIME_LIB') == '1':\n"
        "    raise SystemExit('no runtime library alone in this build')\n")
    tmp_path.chmod(0o755)  # the sandbox's user runs the copy
    return copy


def test_a_later_fresh_worker_runs_on_the_runtime_library_and_falls_back_where_it_cannot(artifact, broken):
    """``processes = "fresh"``: every worker after the compiling one loads the saved inputs on
    TVM's runtime library alone; where that fails it runs again with the compiler, which then
    serves the (build, workload)."""
    results = {}
    for build in (artifact, broken):
        runner = CpuRunner(RunnerConfig(threads=1, processes="fresh"))
        try:
            results[build] = [runner.run(build, MLP, 120, "control") for _ in range(3)]
            refused = dict(runner.tvm.runtime_refused)
        finally:
            runner.teardown()
        assert all(r.status == "ok" and r.server is None for r in results[build]), results[build]
        # the same operators on the same shapes as the compiling worker's
        assert all(r.metrics["op_features"] == results[build][0].metrics["op_features"] for r in results[build])
        # the wheel's runtime library served them; the broken copy's was asked for once, refused,
        # and the workload then run with the compiler
        assert list(refused) == ([] if build == artifact else [MLP.name]), refused


def test_a_build_whose_runtime_library_cannot_serve_is_forked_with_its_compiler(artifact, broken):
    """A build that fails to start with ``TVM_USE_RUNTIME_LIB=1``, or a child that fails on the
    runtime library alone, is told once, and the invocation runs again on a fork server with
    the compiler loaded, which serves the workload from then on; its runs go on."""
    runner = CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=2))
    try:
        assert runner.run(broken, MLP, 120, "control").status == "ok"  # compiles: no runtime library asked for
        children = [runner.run(broken, MLP, 120, "control") for _ in range(3)]
        servers = list(runner.tvm.timed.live.values())
        refused = dict(runner.tvm.runtime_refused)
    finally:
        runner.teardown()
    assert all(c.status == "ok" for c in children), [c.message for c in children]
    assert list(refused) == [MLP.name]
    assert [c.server for c in children] == [1, 1, 2]  # 0: the runtime-only start that failed
    assert servers and all(COMPILER & set(s.libraries) for s in servers)
    # a child that fails on its saved inputs (here made unreadable) is run again, with the compiler
    runner = CpuRunner(RunnerConfig(threads=1, processes="forked", children_per_server=2))
    try:
        assert runner.run(artifact, MLP, 120, "control").status == "ok"
        runner.tvm._saved(artifact, MLP, "control").write_bytes(b"not an npz file")
        again = runner.run(artifact, MLP, 120, "control")
        (server,) = runner.tvm.timed.live.values()
        successors = dict(runner.tvm.timed.successors)
        refused = dict(runner.tvm.runtime_refused)
    finally:
        runner.teardown()
    assert again.status == "ok" and len(again.samples) == 20, again.message
    assert "ValueError" in refused[MLP.name]  # numpy's, reading the file, in the child's reply
    # the failed runtime-only server's successor was closed; the compiler's serves next
    assert all(("TVM_USE_RUNTIME_LIB", "1") not in key[2] for key in successors), successors
    assert COMPILER & set(server.libraries) and again.server == server.index


def test_each_forked_child_moves_its_stack_and_heap_by_its_own_draw(artifact):
    from abwatch.runners.fork_servers import from_child

    runner = CpuRunner(RunnerConfig(threads=1, processes="forked"))
    tvm = runner.tvm
    try:
        assert runner.run(artifact, MLP, 120, "control").status == "ok"  # compiles and exports
        spec = dict(tvm.spec(MLP, {}), load=str(tvm._lib(artifact, MLP, "control")))
        layouts = []
        sandbox = tvm._sandbox("control", artifact)
        with tvm.timed.one("control", artifact, {"TVM_NUM_THREADS": "1"}, sandbox, 300) as server:
            for _ in range(4):
                server.worker.send({"cmd": "fork"})
                layouts.append(from_child(server.worker, 60)["layout"])
                server.worker.send(spec)
                assert from_child(server.worker, 60)["ready"]  # the child loaded the library
                server.worker.send({"cmd": "exit"})
                assert server.worker.receive(60) == {"forked": True, "status": 0}
    finally:
        runner.teardown()
    assert all(0 <= x["stack_depth"] < 64 and 0 <= x["heap_bytes"] < 65536 and x["heap_bytes"] % 16 == 0
               for x in layouts)
    assert len({(x["stack_depth"], x["heap_bytes"]) for x in layouts}) > 1  # four alike: once in 10^17


def mlp_config(path: Path, tvm_cache: Path, runner: str, repetitions: int, seed: int, workload: str = "") -> Path:
    """A config of the small MLP (20 samples a process), one thread, ``repetitions`` processes a
    side at most, compile time not judged; ``runner`` and ``workload``: lines of their own."""
    path.write_text(f"""
cache_dir = {json.dumps(str(tvm_cache))}
[build]
kind = "tvm-wheel"
[runner]
threads = 1
{runner}
[run]
repetitions = {repetitions}
max_repetitions = {repetitions}
compile_repetitions = 0
seed = {seed}
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [1, 64]
options = {{hidden = 64}}
samples = 20
{workload}
""")
    return path


def compare_releases(config: Path, sqlite_url: str, capsys) -> tuple[dict, str]:
    """``abwatch compare`` of the release against itself: its JSON report and what it said."""
    code = main(["compare", "--config", str(config), "--control", NEW, "--treatment", NEW, "--json",
                 "--db", sqlite_url])
    out = capsys.readouterr()
    assert code in (0, 1, 4), out.err
    return json.loads(out.out), out.err


def children_a_server(measured: list[Invocation]) -> list[int]:
    """How many of ``measured`` each (side, server) served, in ascending order."""
    children: dict[tuple, int] = {}
    for row in measured:
        children[(row.side, row.server)] = children.get((row.side, row.server), 0) + 1
    return sorted(children.values())


def test_a_forked_comparison_stores_each_server_and_the_next_takes_the_children_it_learnt(tmp_path, tvm_cache,
                                                                                         sqlite_url, capsys):
    """A comparison through forked workers is judged with the servers as a level and stores
    each process's server; its servers and their costs choose the children a fork server that
    reach an interval fastest (service/stats/repetitions.py, choose_children); the next run of
    the workload takes the learnt count, says so, and stays in the same series."""
    from abwatch.service.compare import noise
    from abwatch.service.store.models import NoiseProfile, Sample

    config = mlp_config(tmp_path / "tvm.toml", tvm_cache, 'processes = "forked"\nchildren_per_server = 2', 8, 5,
                        'measure = ["time", "max_rss"]')

    def compare() -> tuple[dict, str]:
        return compare_releases(config, sqlite_url, capsys)

    first, _ = compare()
    (result,) = first["results"]
    assert result["verdict"] in ("same", "unknown", "regression", "improvement") and not result["failure"], result
    assert result["control"]["n"] == result["treatment"]["n"] == 8 * 20
    # judged with the servers as a level: the eight pairs came from four (control, treatment) server pairs
    assert "fork servers as a level: 4 server pairs" in result["method"] and result["design_effect"] >= 1.0, result
    (memory,) = result["metrics"]  # a metric of the same processes takes their servers too
    assert memory["metric"] == "max_rss" and memory["design_effect"] >= 1.0, memory
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        stored = session.scalars(select(Comparison.verdict).where(Comparison.run_id == first["run_id"])).all()
        assert [v.value for v in stored] == [result["verdict"]]
        everything = session.scalars(select(Invocation).where(Invocation.run_id == first["run_id"])).all()
        measured = [r for r in everything if not r.warmup]
        assert len(measured) == 16
        # the warm-up invocation of each side compiles (fresh); every measured one was forked
        assert all(r.server is None for r in everything if r.warmup)
        by_side = {side: [r.server for r in measured if r.side.value == side] for side in ("control", "treatment")}
        assert all(s is not None for servers in by_side.values() for s in servers)
        assert not set(by_side["control"]) & set(by_side["treatment"])
        assert sorted(len(set(servers)) for servers in by_side.values()) == [4, 4]  # 8 children a side, 2 a server
        rows = {r.id: r for r in session.scalars(select(Invocation).where(Invocation.run_id == first["run_id"]))}
        samples: dict[str, list[float]] = {"control": [], "treatment": []}
        groups: dict[str, list[int]] = {"control": [], "treatment": []}
        servers: dict[str, list] = {"control_servers": [], "treatment_servers": []}
        for row in session.scalars(select(Sample).where(Sample.run_id == first["run_id"], Sample.warmup.is_(False))
                                   .order_by(Sample.id)):
            samples[row.side.value].append(row.runtime_ms)
            groups[row.side.value].append(rows[row.invocation_id].position)
            servers[f"{row.side.value}_servers"].append(rows[row.invocation_id].server)
        costs = noise.server_costs(session, first["run_id"], result["workload_id"])
        # each server's first child recorded its start (an import of TVM), started ahead on two CPUs
        assert costs is not None and costs.start_s > 0 and costs.child_s > 0 and costs.ahead, costs
        assert noise.server_costs(session, first["run_id"], result["workload_id"], ahead=False) == replace(
            costs, ahead=False)  # a runner told not to start them ahead: every start is paid
        started = session.scalars(select(Invocation.server_start_s).where(
            Invocation.run_id == first["run_id"], Invocation.server_start_s.is_not(None))).all()
        assert len(started) == 8 and min(started) > 0.1, started  # one a server, each at least an interpreter's start
        choice = noise.choose_children(session, first["run_id"], result["workload_id"], samples, groups, servers, 2)
        assert choice is not None and "from 8 servers" in choice.reason, choice
        assert {o.children for o in choice.options} == {2}  # none above the runner's
        wider = noise.choose_children(session, first["run_id"], result["workload_id"], samples, groups, servers, 8)
        assert wider is not None and {2, 3, 4, 8} <= {o.children for o in wider.options}, wider
        assert f"{wider.children} children a fork server (" in wider.reason
        # learnt as the run was stored, whatever its verdict; from the same figures where it was
        # judged on wall time (under heavy contention, on the processes' CPU time)
        profile = session.scalars(select(NoiseProfile)).one()
        assert profile.children is not None and profile.lessons == 1, profile
        if result["unit"] == "ms":  # with the samples the run taught too: its children take them
            taught = noise.choose_samples(session, first["run_id"], result["workload_id"], samples, groups, 20)
            same_run = noise.choose_children(session, first["run_id"], result["workload_id"], samples, groups,
                                             servers, 2, chosen=taught)
            assert same_run is not None
            assert (profile.children, profile.children_reason) == (same_run.children, same_run.reason)
        profile.children, profile.children_reason = 4, "4 children a fork server (chosen)"
        # no noise learnt: the next run's first look is the configured 12 pairs (a learnt noise
        # may start at fewer, whose first look is fitted below 4 a server: another test's)
        profile.process_cv = None

    # the runner now at 8 a server: the 4 learnt (fewer) is what the next run takes (12 pairs: at 8
    # pairs a run would serve 3 a server, the most that still make three server pairs)
    config.write_text(config.read_text().replace("children_per_server = 2", "children_per_server = 8")
                      .replace("repetitions = 8", "repetitions = 12"))
    second, err = compare()
    (again,) = second["results"]
    assert "4 children a fork server (chosen), learnt from 1 past run(s)" in err
    assert "4 children a fork server (chosen)" in again["stop_reason"], again
    assert again["workload_id"] == result["workload_id"]  # the same series
    with db.session_scope(engine) as session:
        measured = session.scalars(select(Invocation).where(Invocation.run_id == second["run_id"],
                                                            Invocation.warmup.is_(False))).all()
        assert children_a_server(measured) == [4] * 6  # 12 a side, 4 a server
    engine.dispose()


def test_the_default_forks_and_a_capped_run_serves_fewer_children_a_server(tmp_path, tvm_cache, sqlite_url,
                                                                         capsys):
    """Timed workers are forked by default; a run capped at twelve processes a side, which at
    the runner's eight children a server could never have three server pairs of two, serves
    five a server (5 + 5 + 2: three server pairs, an interval), said in why the run stopped."""
    payload, _ = compare_releases(mlp_config(tmp_path / "capped.toml", tvm_cache, "", 12, 3), sqlite_url, capsys)
    (result,) = payload["results"]
    with db.session_scope(db.make_engine(sqlite_url)) as session:
        measured = session.scalars(select(Invocation).where(Invocation.run_id == payload["run_id"],
                                                            Invocation.warmup.is_(False))).all()
        assert all(row.server is not None for row in measured)  # forked, though the config never asked
        assert children_a_server(measured) == [2, 2, 5, 5, 5, 5]
    assert "5 children a fork server (at most 12 processes a side" in result["stop_reason"], result
    assert "fork servers as a level: 3 server pairs" in result["method"] and result["ci_pct"] is not None, result


def test_a_first_look_serves_the_children_that_leave_it_an_interval(tmp_path, tvm_cache, sqlite_url, capsys):
    """A run that may go on past its first look (24 processes a side at most) serves the first
    look's 12 pairs from five children a server (5 + 5 + 2: three server pairs, an interval at
    that look, where eight would make two and none), and the runner's eight after it."""
    config = mlp_config(tmp_path / "first.toml", tvm_cache, "", 12, 4)
    config.write_text(config.read_text().replace("max_repetitions = 12", "max_repetitions = 24"))
    payload, err = compare_releases(config, sqlite_url, capsys)
    (result,) = payload["results"]
    with db.session_scope(db.make_engine(sqlite_url)) as session:
        measured = session.scalars(select(Invocation).where(Invocation.run_id == payload["run_id"],
                                                            Invocation.warmup.is_(False))
                                   .order_by(Invocation.position)).all()
        first = [row for side in ("control", "treatment") for row in [r for r in measured if r.side.value == side][:12]]
        assert children_a_server(first) == [2, 2, 5, 5, 5, 5]
        assert max(children_a_server(measured)) <= 8
    assert "5 children a fork server (for the first look's 12 pairs" in result["stop_reason"], result
    look_1 = [line for line in err.splitlines() if "look 1:" in line]
    # decided at the first look with its interval, or went on after one
    assert (result["looks"] == 1 and result["ci_pct"] is not None) or "(CI " in look_1[0], (result, look_1)
