"""Duet runs (``[run] schedule = "duet"``): a pair's two sides at once, each pinned to a core of its own;
``"duet-one-cpu"``: both pinned to one CPU, judged on CPU time.

Real processes: each measured process reports the CPUs it may run on (``os.sched_getaffinity``)
and when it ran, and the tests check that a pair's two sides ran on different single CPUs at the
same time. The choice of cores is a pure function, tested on made-up topologies; a host (or a
process) with one CPU is refused by the name of the key, before anything is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from abwatch.core.errors import UsageError
from abwatch.core.metric_names import Metric
from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.builders.procs import pinned
from abwatch.runners import CpuRunner
from abwatch.runners.duet import Cores, choose_cores, choose_cpu, host_cores, measure_duet, pairs, parse_cpu_list
from abwatch.runners.harness import interleaved_schedule
from abwatch.service.cli.main import main
from abwatch.service.compare.schedule import MEMORY_BOUND, schedule_for
from abwatch.service.config import CommandWorkloadConfig, RunnerConfig, TvmWorkloadConfig, load_config
from abwatch.service.store import db
from abwatch.service.store.models import Comparison, Invocation, MetricMeasurement, RegressionKind, Run
from abwatch.service.store.rows import workload_spec_hash



@pytest.fixture
def two_cpus() -> None:
    # not a skip: a skipped duet test proves nothing; the project's machines have two CPUs
    assert len(os.sched_getaffinity(0)) >= 2, "tests/test_duet.py needs two CPUs: a duet pins its sides apart"


needs_two = pytest.mark.usefixtures("two_cpus")

# A measured process that says where and when it ran: ~0.25 s of work, its CPUs, its start and end.
REPORTER = """
import json, os, time
t0 = time.time()
x = 0
while time.time() - t0 < 0.25:
    x += 1
t1 = time.time()
print(json.dumps({"runtime_raw": [{"runtime_ms": (t1 - t0) * 1e3}], "cpus": sorted(os.sched_getaffinity(0)),
                  "t0": t0, "t1": t1}))
"""


@contextmanager
def one_cpu():
    """This process (its main thread) on one CPU while the block runs, as a 1-CPU host would be."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_cores_are_two_separate_cores_where_there_are():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}
    two = choose_cores(frozenset({0, 1}), {0: frozenset({0}), 1: frozenset({1})})
    assert two == Cores((0, 1), siblings=False) and two.warning is None
    # four CPUs, two cores of two SMT threads each (0,2 and 1,3): two cores, CPU 0 left out
    smt = {0: frozenset({0, 2}), 2: frozenset({0, 2}), 1: frozenset({1, 3}), 3: frozenset({1, 3})}
    assert choose_cores(frozenset(smt), smt) == Cores((1, 2), siblings=False)
    # only the two threads of one core: chosen, and warned of
    siblings = choose_cores(frozenset({4, 5}), {4: frozenset({4, 5}), 5: frozenset({4, 5})})
    assert siblings.siblings and siblings.cpus == (4, 5)
    assert "SMT siblings" in siblings.warning and 'run.schedule = "duet"' in siblings.warning
    assert "SMT siblings" in siblings.describe()
    with pytest.raises(UsageError, match=r'run.schedule = "duet".*1 CPU \(3; os.sched_getaffinity\)'):
        choose_cores(frozenset({3}), {})


@needs_two
def test_a_pinned_start_leaves_this_threads_cpus_as_they_were():
    mine = os.sched_getaffinity(0)
    other = max(mine)
    with pinned(frozenset({other})):
        assert os.sched_getaffinity(0) == {other}
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
    assert json.loads(child.stdout) == [other] and os.sched_getaffinity(0) == mine
    with pytest.raises(RuntimeError), pinned(frozenset({other})):
        raise RuntimeError("a start that failed")
    assert os.sched_getaffinity(0) == mine


def test_a_duet_on_one_cpu_takes_one_cpu_and_cpu_0_last():
    assert choose_cpu(frozenset({0, 2, 3})) == Cores((2, 2), siblings=False)
    only = choose_cpu(frozenset({0}))  # one CPU is all it needs
    assert only.cpus == (0, 0) and only.one_cpu and only.warning is None
    assert "both pinned to CPU 0" in only.describe() and "judged on CPU time" in only.describe()
    assert not Cores((0, 1), siblings=False).one_cpu
    with pytest.raises(ValueError):
        choose_cpu(frozenset())


def test_a_duet_on_one_cpu_runs_both_sides_on_that_cpu_at_once(tmp_path):
    runner = CpuRunner()
    workload = CommandWorkloadConfig(name="where", command=[sys.executable, "-c", REPORTER])
    schedule = interleaved_schedule(2, 0, random.Random(5))
    stored = []
    with one_cpu():  # not refused where this process may use one CPU alone
        cores = host_cores("duet-one-cpu")
        m = measure_duet(runner, {CONTROL: tmp_path, TREATMENT: tmp_path}, workload, schedule, 30,
                         lambda slot, result: stored.append((slot, result)), cores)
    assert cores.one_cpu and m.failure is None and [slot for slot, _ in stored] == schedule
    for (_, ra), (_, rb) in zip(stored[::2], stored[1::2], strict=True):
        ca, cb = ra.records[0], rb.records[0]
        assert ca["cpus"] == cb["cpus"] == [cores.cpus[0]]  # both sides on the one CPU
        assert ca["t0"] < cb["t1"] and cb["t0"] < ca["t1"]  # at the same time
        assert ra.cpu_s is not None and rb.cpu_s is not None  # what the pair is judged on
    runner.teardown()


def test_pairs_of_a_schedule():
    schedule = interleaved_schedule(4, 1, random.Random(1))
    paired = pairs(schedule)
    assert len(paired) == 5 and all({a.side, b.side} == {CONTROL, TREATMENT} for a, b in paired)
    with pytest.raises(ValueError, match="whole pairs"):
        pairs(schedule[:3])


def test_which_workloads_run_as_a_duet():
    cores = Cores((0, 1), siblings=False)
    assert schedule_for("interleaved", None, memory_bound=True, pinnable=True, kind="command").note == ""
    duet = schedule_for("duet", cores, memory_bound=False, pinnable=True, kind="command")
    assert duet.cores == cores and "duet" in duet.note and "CPUs 0 and 1" in duet.note
    memory = schedule_for("duet", cores, memory_bound=True, pinnable=True, kind="command")
    assert memory.cores is None and memory.note == MEMORY_BOUND and "memory_bound" in memory.note
    other = schedule_for("duet", cores, memory_bound=False, pinnable=False, kind="toy")
    assert other.cores is None and "toy workloads" in other.note


def test_memory_bound_keeps_the_workloads_series():
    plain = CommandWorkloadConfig(name="w", command=["x"]).model_dump(mode="json")
    marked = CommandWorkloadConfig(name="w", command=["x"], memory_bound=True).model_dump(mode="json")
    assert workload_spec_hash("command", plain) == workload_spec_hash("command", marked)


@needs_two
def test_a_duets_two_sides_run_pinned_to_different_cores_at_once(tmp_path):
    cores, mine = host_cores(), os.sched_getaffinity(0)
    runner = CpuRunner()
    workload = CommandWorkloadConfig(name="where", command=[sys.executable, "-c", REPORTER])
    schedule = interleaved_schedule(2, 0, random.Random(5))  # one ABBA or BAAB block: 2 pairs
    stored = []
    m = measure_duet(runner, {CONTROL: tmp_path, TREATMENT: tmp_path}, workload, schedule, 30,
                     lambda slot, result: stored.append((slot, result)), cores)
    assert m.failure is None and [slot for slot, _ in stored] == schedule  # stored in slot order
    seen = {CONTROL: set(), TREATMENT: set()}
    for (a, ra), (b, rb) in zip(stored[::2], stored[1::2], strict=True):
        ca, cb = ra.records[0], rb.records[0]
        assert len(ca["cpus"]) == 1 and len(cb["cpus"]) == 1 and set(ca["cpus"]).isdisjoint(cb["cpus"])
        assert (ca["cpus"][0], cb["cpus"][0]) == cores.cpus  # the pair's first slot on the first core
        assert ca["t0"] < cb["t1"] and cb["t0"] < ca["t1"]  # they ran at the same time
        seen[a.side].add(ca["cpus"][0])
        seen[b.side].add(cb["cpus"][0])
    assert seen[CONTROL] == seen[TREATMENT] == set(cores.cpus)  # each side had each core once
    assert len(m.samples[CONTROL]) == len(m.samples[TREATMENT]) == 2
    assert os.sched_getaffinity(0) == mine  # pinned were the measured processes, not this thread
    runner.teardown()


@needs_two
def test_a_side_that_fails_to_start_does_not_hold_the_other(tmp_path):
    runner = CpuRunner()
    workload = CommandWorkloadConfig(name="half", command=["./only-in-treatment"])
    (tmp_path / "t").mkdir()
    script = tmp_path / "t" / "only-in-treatment"
    script.write_text('#!/bin/sh\necho \'{"runtime_ms": 1}\'\n')
    script.chmod(0o755)
    (tmp_path / "c").mkdir()
    m = measure_duet(runner, {CONTROL: tmp_path / "c", TREATMENT: tmp_path / "t"}, workload,
                     interleaved_schedule(2, 0, random.Random(1)), 10, lambda *_: None, host_cores())
    assert m.failure is not None and m.failure.startswith("control invocation") and "cannot start" in m.failure
    runner.teardown()


def test_refused_on_one_cpu_before_anything_is_built(capsys, write_config, sqlite_url):
    config = write_config(run_extra='schedule = "duet"\nmax_repetitions = 4', repetitions=4)
    with one_cpu():
        with pytest.raises(UsageError, match=r'run.schedule = "duet" runs a pair.*may use 1 CPU'):
            host_cores()
        code = main(["compare", "--config", str(config), "--control", "base", "--treatment", "noop",
                     "--db", sqlite_url])
    err = capsys.readouterr().err
    assert code == 2 and 'run.schedule = "duet"' in err and "1 CPU" in err
    engine = db.make_engine(sqlite_url)
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(Run)) == 0


@pytest.mark.parametrize("schedule", ["duet", "duet-one-cpu"])
def test_duet_is_the_cpu_runners_only(tmp_path, schedule):
    path = tmp_path / "c.toml"
    path.write_text(f"""
[repo]
url = "{tmp_path}"
[build]
kind = "command"
command = ["true"]
[[workloads]]
name = "w"
kind = "tvm"
model = "builtin:mlp"
[run]
schedule = "{schedule}"
[runner]
kind = "gpu"
""")
    with pytest.raises(Exception, match=rf'run.schedule = "{schedule}" runs both sides at once.*cpu runner'):
        load_config(path)


@needs_two
def test_a_duet_compare_says_its_schedule(capsys, write_config, sqlite_url):
    """End to end: the timed pairs of a workload run as duets and its stop reason says so; a
    workload marked memory_bound stays interleaved, and says why."""
    memory = '\n[[workloads]]\nname = "stream"\nkind = "command"\ncommand = ["./bench", "10"]\nmemory_bound = true\n'
    config = write_config(run_extra=f'schedule = "duet"\nmax_repetitions = 4\n{memory}', repetitions=4)
    code = main(["compare", "--config", str(config), "--control", "base", "--treatment", "noop",
                 "--db", sqlite_url])
    out = capsys.readouterr().out
    assert code in (0, 1, 3, 4), out
    assert "loop:" in out and "duet: each pair's two sides at once, pinned to CPUs" in out
    assert "stream:" in out and "interleaved, not duet: marked memory_bound" in out
    engine = db.make_engine(sqlite_url)
    with engine.connect() as connection:
        details = [json.dumps(d) for d in connection.scalars(select(Comparison.details))]
        assert len(details) == 2  # what `abwatch show` prints again: the schedule is kept with the verdict
        assert any("duet: each pair" in d for d in details) and any("marked memory_bound" in d for d in details)
        assert connection.scalar(select(func.count()).select_from(Invocation)) == 2 * 2 * (1 + 4)


def test_a_duet_on_one_cpu_compare_is_judged_on_cpu_time(capsys, write_config, sqlite_url):
    """End to end: a run of duets on one CPU says so, and its verdict was judged on CPU time
    on a host that is not busy (every process shared its CPU with the other side)."""
    config = write_config(run_extra='schedule = "duet-one-cpu"\nmax_repetitions = 4', repetitions=4)
    code = main(["compare", "--config", str(config), "--control", "base", "--treatment", "noop",
                 "--db", sqlite_url])
    out = capsys.readouterr().out
    assert code in (0, 1, 3, 4), out
    assert "loop:" in out and "duet on one CPU: each pair's two sides at once, both pinned to CPU" in out
    engine = db.make_engine(sqlite_url)
    with engine.connect() as connection:
        (details,) = connection.scalars(select(Comparison.details)).all()
        assert "duet on one CPU" in json.dumps(details)
        (judged,) = connection.scalars(select(MetricMeasurement.judged)
                                       .where(MetricMeasurement.phase == RegressionKind.RUNTIME,
                                              MetricMeasurement.metric == Metric.TIME)).all()
        assert judged["unit"] == "cpu ms" and judged["caveat"].startswith("a duet on one CPU")
        assert connection.scalar(select(func.count()).select_from(Invocation)) == 2 * (1 + 4)


@needs_two
@pytest.mark.slow  # a real TVM wheel's venv (once a session) and two compiles
@pytest.mark.parametrize("processes", ["fresh", "forked"])
def test_a_tvm_duets_workers_run_pinned_on_one_thread_at_once(tvm_python, processes):
    """TVM workloads too: each side's measured process times on one thread pinned to its own
    CPU, the pair's two timing batches at once (each says, from inside, when it began and the
    CPUs it could run on). A fresh worker is pinned from its start (seen from outside, by its
    affinity while it runs); a forked one is a child of its side's fork server, which is not
    pinned: it serves its side's children on either CPU, each pinning itself."""
    artifact = Path(tvm_python).parent.parent
    cores, runner = host_cores(), CpuRunner(RunnerConfig(threads=1, processes=processes))
    workload = TvmWorkloadConfig(name="mlp", model="builtin:mlp", input_shape=[1, 64], options={"hidden": 64},
                                 samples=100, number=100)  # a batch of ~0.1 s: longer than a barrier's latency
    results: list = []  # (slot, result), the warm-up pair's (the compiling workers, fresh in either mode) too
    affinities: set[frozenset[int]] = set()  # of the fresh workers, seen from outside while they run
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for proc in psutil.process_iter(["cmdline"]):
                with contextlib.suppress(psutil.Error):
                    if str(artifact) in " ".join(proc.info["cmdline"] or ()) and \
                            any(str(part).endswith("tvm_worker.py") for part in proc.info["cmdline"] or ()):
                        affinities.add(frozenset(proc.cpu_affinity()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:  # a warm-up pair and two measured pairs: an ABBA block puts each side once on each CPU
        m = measure_duet(runner, {CONTROL: artifact, TREATMENT: artifact}, workload,
                         interleaved_schedule(2, 1, random.Random(2)), 600,
                         lambda slot, result: results.append((slot, result)), cores)
    finally:
        done.set()
        watcher.join()
        runner.teardown()
    assert m.failure is None and all(f.threads == 1 for side in (CONTROL, TREATMENT) for f in m.processes[side])
    assert len(m.samples[CONTROL]) == len(m.samples[TREATMENT]) == 2 * workload.samples
    # seen from outside: every fresh worker pinned; in the forked mode the servers on every CPU
    assert {len(cpus) for cpus in affinities} == ({1} if processes == "fresh" else {1, len(os.sched_getaffinity(0))})
    for (_, first), (_, second) in zip(results[::2], results[1::2], strict=True):  # each pair, the warm-up too
        assert {first.cpus, second.cpus} == {(cpu,) for cpu in cores.cpus}, (first.cpus, second.cpus)
        # the two batches overlapped: each began before the other ended
        assert first.began < second.began + second.usage_wall_s and second.began < first.began + first.usage_wall_s
    measured = [(slot, r) for slot, r in results if not slot.warmup]
    servers = {side: {r.server for slot, r in measured if slot.side == side} for side in (CONTROL, TREATMENT)}
    ran_on = {side: {r.cpus for slot, r in measured if slot.side == side} for side in (CONTROL, TREATMENT)}
    assert all(len(cpus) == 2 for cpus in ran_on.values()), ran_on  # each side on each CPU once
    if processes == "fresh":
        assert servers == {CONTROL: {None}, TREATMENT: {None}}
    else:  # each side's two children from one server of its own, so that server served both CPUs
        assert all(len(s) == 1 and None not in s for s in servers.values()), servers
        assert servers[CONTROL] != servers[TREATMENT]
