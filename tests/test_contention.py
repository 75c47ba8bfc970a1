"""Sizes under heavy contention: each process says how contended it was, and a contended
verdict is judged on CPU time per process (or refused), never on inflated wall times."""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import numpy as np
import pytest

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.sandbox import Sandbox
from abwatch.runners.harness import Measurement, ProcessFigures
from abwatch.service import stats
from abwatch.service.compare import contended
from abwatch.service.config import CommandWorkloadConfig, CommandBuildConfig, Config
from abwatch.service.stats import Outcome
from abwatch.service.stats.contention import CPU_UNIT, Contention, assess

BUDGET = stats.Budget(max_seconds=600, max_pairs=40, batch=10)


def config(**stats_options) -> Config:
    return Config(build=CommandBuildConfig(command=["true"], artifacts="."),
                  repo={"url": "/nonexistent"},
                  workloads=[CommandWorkloadConfig(name="loop", command=["true"])],
                  stats={"threshold_pct": 5.0, **stats_options})


def test_assess_calls_heavy_only_a_low_share_with_preemptions():
    # load 8 on 2 cores, as measured here: ~12 % of the wall time on a CPU, ~300 preemptions per CPU second
    contended_ = assess([0.45] * 6, [0.054] * 6, [16] * 6)
    assert contended_.heavy and 0.11 < contended_.cpu_share < 0.13 and 290 < contended_.preemptions_per_cpu_s < 300
    assert "heavy contention" in contended_.describe() and "12%" in contended_.describe()
    alone = assess([0.045] * 6, [0.043] * 6, [0] * 6)
    assert not alone.heavy and alone.cpu_share > 0.9
    # a process that sleeps or waits on I/O has a low share but gives the CPU up itself: not contention
    sleeper = assess([1.0] * 6, [0.01] * 6, [0] * 6)
    assert not sleeper.heavy and sleeper.cpu_share < 0.5
    # too few processes with figures (TVM workers have none): not assessed
    unmeasured = assess([0.45] * 6, [None] * 4 + [0.05] * 2, [None] * 4 + [20] * 2)
    assert unmeasured.processes == 2 and unmeasured.cpu_share is None and not unmeasured.heavy
    assert Contention.from_dict(contended_.to_dict()) == contended_
    assert not assess([0.45] * 6, [0.054] * 6, [16] * 6, max_share=0.0).heavy  # contention_share = 0: never


def test_long_samples_each_preempted_are_heavy_contention_at_a_high_share():
    # measured (builtin:mlp at batch 128, a fork server's child beside six busy loops): 92 % of
    # its wall time on a CPU, 95 preemptions per CPU second, 55 ms samples: ~5 preemptions in
    # each sample, so the fastest of 5 is no clean sample
    long = assess([0.30] * 6, [0.276] * 6, [26] * 6, fastest_s=[0.055] * 6, samples=[5] * 6)
    assert long.cpu_share > 0.9 and long.heavy and 4.5 < long.preemptions_per_sample < 5.5 and long.unclean > 0.9
    assert "5.2 times a sample" in long.describe() and "no sample left alone" in long.describe()
    assert Contention.from_dict(long.to_dict()) == long
    # the same rate for the quickstart's 0.8 ms samples: most samples ran clean
    short = assess([0.30] * 6, [0.276] * 6, [26] * 6, fastest_s=[0.0008] * 6, samples=[5] * 6)
    assert not short.heavy and short.unclean < 1e-4 and "times a sample" not in short.describe()
    # a quiet host's few preemptions: among 20 samples of 55 ms one is clean
    quiet = assess([1.1] * 6, [1.09] * 6, [11] * 6, fastest_s=[0.055] * 6, samples=[20] * 6)
    assert not quiet.heavy and quiet.unclean < 0.01
    # but one sample a process, however long, is clean only by luck
    assert assess([1.1] * 6, [1.09] * 6, [11] * 6, fastest_s=[0.3] * 6, samples=[1] * 6).heavy
    assert not assess([0.30] * 6, [0.276] * 6, [26] * 6, fastest_s=[0.055] * 6, samples=[5] * 6, max_share=0.0).heavy
    with pytest.raises(ValueError, match="parallel"):
        assess([0.3] * 6, [0.2] * 6, [2] * 6, fastest_s=[0.05] * 5, samples=[5] * 6)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["bare", "sandboxed"])
def test_a_real_process_reports_its_cpu_time_and_preemptions(sandboxed):
    # sandboxed, the child reaped is bubblewrap: its figures must include the workload it waited for
    box = Sandbox() if sandboxed else None
    assert not sandboxed or box.active
    busy = run_process([sys.executable, "-c", "x = 0\nfor i in range(3_000_000): x += i"], cwd=None,
                       env=child_env(), timeout_s=60, sandbox=box)
    assert busy.returncode == 0 and busy.cpu_s is not None and busy.involuntary_switches is not None
    assert 0.05 < busy.cpu_s <= busy.wall_s * 2 + 0.05  # 2 cores at most; CPU time never exceeds that
    sleeper = run_process([sys.executable, "-c", "import time; time.sleep(0.5)"], cwd=None, env=child_env(),
                          timeout_s=60, sandbox=box)
    assert sleeper.returncode == 0 and sleeper.wall_s >= 0.5 and sleeper.cpu_s < sleeper.wall_s / 2
    killed = run_process([sys.executable, "-c", "import time; time.sleep(30)"], cwd=None, env=child_env(),
                         timeout_s=0.5, sandbox=box)
    assert killed.timed_out and killed.returncode is None and killed.cpu_s is not None


def measurement(rng: random.Random, pairs: int, cpu_change: float, cpu: bool = True) -> Measurement:
    """Processes at load ~8: each sample's wall time is its work plus 0-3 whole time slices of
    waiting (~3 ms each, what inflated +20 % to +98 %); the CPU time carries the true change."""
    m = Measurement({CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []})
    position = 0
    for _ in range(pairs):
        for side in (CONTROL, TREATMENT) if rng.random() < 0.5 else (TREATMENT, CONTROL):
            work_ms = 4.0 * (1 + cpu_change if side == TREATMENT else 1.0)
            # the treatment happens to meet more waiting: the quantization that made +98 %
            waits = (1, 3) if side == TREATMENT else (0, 2)
            samples = [work_ms + 3.0 * rng.randint(*waits) for _ in range(10)]
            cpu_s = (10 * work_ms + 1.0) * rng.uniform(0.99, 1.01) / 1000
            m.samples[side].extend(samples)
            m.groups[side].extend([position] * 10)
            m.processes[side].append(ProcessFigures(position, wall_s=8 * cpu_s, cpu_s=cpu_s if cpu else None,
                                                    involuntary_switches=int(300 * cpu_s) if cpu else None))
            position += 1
    return m


def test_under_heavy_contention_the_size_is_judged_on_cpu_time():
    m = measurement(random.Random(3), 10, 0.20)
    wall = stats.sequential_look(m.samples[CONTROL], m.samples[TREATMENT], m.groups[CONTROL], m.groups[TREATMENT],
                                 look=1, elapsed_s=5, budget=BUDGET, threshold_pct=5.0)
    assert wall.verdict.change_pct > 40  # what wall time says: far from the +20 % the work changed
    step = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12)
    v = step.verdict
    assert v.verdict == Outcome.REGRESSION and 17 < v.change_pct < 21 and v.ci_pct[0] > 5
    assert v.unit == CPU_UNIT and (v.control_n, v.treatment_n) == (100, 100)  # n still counts timing samples
    assert v.control_median_ms == float(np.median(m.samples[CONTROL]))  # and the plain medians are theirs
    assert 40 < v.control_ms < 42  # the figure judged: CPU ms per process (10 samples of 4 ms and start-up)
    assert v.reason.startswith("heavy contention") and "judged on CPU time per process" in v.caveat
    assert "CPU time" in v.estimator
    # Benjamini-Hochberg decides again and keeps what the reader must know
    adjusted = stats.adjust_fdr([v, v])[0]
    assert adjusted.caveat == v.caveat and adjusted.reason.startswith("heavy contention")
    assert stats.Verdict.from_dict(v.to_dict()) == v


def test_without_heavy_contention_wall_time_decides_as_before():
    m = measurement(random.Random(4), 10, 0.20)
    calm = config(contention_share=0.0)  # never heavy: the wall-time look, unchanged
    step = contended.look(m, calm, look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12)
    assert step.verdict.unit == "ms" and not step.verdict.caveat and step.verdict.control_n == 100


def test_a_duet_on_one_cpu_is_judged_on_cpu_time_at_any_load():
    # its two sides take turns on one CPU: each one's wall time holds the other's slices, so CPU
    # time decides even where the load is not heavy (here: never heavy), or nothing does
    m = measurement(random.Random(4), 10, 0.20)
    calm = config(contention_share=0.0)
    v = contended.look(m, calm, look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12, one_cpu=True).verdict
    assert v.unit == CPU_UNIT and v.verdict == Outcome.REGRESSION and 17 < v.change_pct < 21
    assert v.reason.startswith(contended.ONE_CPU) and "judged on CPU time per process" in v.caveat
    first = m.processes[CONTROL][0]  # one process without a CPU time: refused, not sized on wall time
    m.processes[CONTROL][0] = ProcessFigures(first.position, first.wall_s, None, None)
    step = contended.look(m, calm, look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12, one_cpu=True)
    assert step.stop and step.verdict.verdict == Outcome.UNKNOWN and step.verdict.change_pct is None
    assert step.verdict.reason.startswith(f"not judged: {contended.ONE_CPU}")


def test_long_preempted_samples_are_judged_on_cpu_time_at_a_high_share():
    # the measured shape: 55 ms samples kept 92 % of their wall time, each preempted ~5 times
    # (~1 ms each), so a fastest sample carries 2-8 of them: wall time spreads, CPU time does not
    rng = random.Random(7)
    m = Measurement({CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []}, {CONTROL: [], TREATMENT: []})
    for position in range(40):
        side = (CONTROL, TREATMENT)[position % 2]
        samples = [55.0 + rng.randint(2, 8) * 1.0 for _ in range(5)]
        cpu_s = 0.33 * rng.uniform(0.995, 1.005)
        m.samples[side].extend(samples)
        m.groups[side].extend([position] * 5)
        m.processes[side].append(ProcessFigures(position, wall_s=cpu_s / 0.92, cpu_s=cpu_s,
                                                involuntary_switches=int(95 * cpu_s)))
    assessed = contended.assessed(m, config())
    assert assessed.heavy and assessed.cpu_share > 0.9 and assessed.unclean > 0.9
    v = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12).verdict
    assert v.unit == CPU_UNIT and "times a sample" in v.caveat and "CPU time per process" in v.caveat
    assert v.ci_pct[1] - v.ci_pct[0] < 2.0
    assert contended.judged_samples(m, v) == (m.samples, m.groups, min)  # no sample's own CPU time to teach from
    # where each sample's CPU time was marked, a process is judged by the mean of its faster half
    # (its timed calls alone): of 49, ~50 x3 and 51, the fastest two
    for side in (CONTROL, TREATMENT):
        m.processes[side] = [replace(f, cpu_samples=(49.0, 51.0, *(50.0 * rng.uniform(0.999, 1.001) for _ in range(3))))
                             for f in m.processes[side]]
    v = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12).verdict
    assert v.unit == CPU_UNIT and "faster half of samples in CPU time" in v.caveat and "faster half" in v.estimator
    assert 49.4 < v.control_ms < 49.6 and v.ci_pct[1] - v.ci_pct[0] < 0.5  # neither the fastest (49) nor the mean (50)
    judged, groups, typical = contended.judged_samples(m, v)
    assert len(judged[CONTROL]) == len(m.samples[CONTROL]) and judged[CONTROL][0] == 49.0
    assert groups == m.groups and typical is stats.cpu_figure
    # one process short of a mark: the batch's CPU time again, for every process
    f = m.processes[TREATMENT][3]
    m.processes[TREATMENT][3] = replace(f, cpu_samples=f.cpu_samples[:4])
    assert not contended.has_cpu_samples(m)
    assert "CPU time per process" in contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1,
                                                    plan_pairs=12).verdict.caveat


def test_a_process_is_judged_by_the_faster_half_of_its_cpu_samples():
    # the neighbours' caches slow a sample far more often than they speed one: the slow tail is
    # left out, and no single fastest draw stands for the process
    assert stats.cpu_figure([3.0, 1.0, 2.0, 10.0, 1.5]) == pytest.approx(1.25)
    assert stats.cpu_figure([2.0, 1.0, 4.0, 3.0]) == pytest.approx(1.5)
    assert stats.cpu_figure([7.0]) == 7.0
    with pytest.raises(ValueError, match="without samples"):
        stats.cpu_figure([])


def test_heavy_contention_without_cpu_times_is_refused_not_sized():
    m = measurement(random.Random(5), 10, 0.20)
    # enough processes with figures to see the contention, one without: no CPU time to judge all on
    first = m.processes[CONTROL][0]
    m.processes[CONTROL][0] = ProcessFigures(first.position, first.wall_s, None, None)
    step = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12)
    assert step.stop  # the wall-time rule stopped; its size is not reported
    v = step.verdict
    assert v.verdict == Outcome.UNKNOWN and v.change_pct is None and v.ci_pct is None and v.p_value is None
    assert v.reason.startswith("not judged: heavy contention") and "cannot be stood behind" in v.reason
    assert "wall time said: regression" in v.reason


def test_threads_share_the_wall_time_and_several_threads_are_refused_not_judged_on_cpu():
    m = measurement(random.Random(6), 10, 0.20)
    for side in (CONTROL, TREATMENT):  # the same processes on 2 threads: twice the CPU time a second
        m.processes[side] = [replace(f, cpu_s=2 * f.cpu_s, threads=2) for f in m.processes[side]]
    assessed = contended.assessed(m, config())
    assert assessed.heavy and 0.12 < assessed.cpu_share < 0.13  # per thread, as for one
    step = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=1, plan_pairs=12)
    v = step.verdict
    assert v.verdict == Outcome.UNKNOWN and v.change_pct is None
    assert "processes ran on several threads" in v.reason and "wall time said: regression" in v.reason


def test_no_noise_shape_makes_cpu_judging_inflate_a_null_change():
    # an A/A under heavy contention, many seeds: CPU time says `same` (or unknown), never a change
    for seed in range(20):
        m = measurement(random.Random(seed), 10, 0.0)
        v = contended.look(m, config(), look=1, elapsed_s=5, budget=BUDGET, seed=seed, plan_pairs=12).verdict
        assert v.unit == CPU_UNIT and v.verdict in (Outcome.SAME, Outcome.UNKNOWN), (seed, v)
        assert abs(np.log1p(v.change_pct / 100)) < 0.02


def test_an_alert_says_its_verdict_was_taken_under_heavy_contention(filled_pg_url):
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from abwatch.service.notify import alerts
    from abwatch.service.store import db
    from abwatch.service.store.models import Regression

    url, _ = filled_pg_url
    engine = db.make_engine(url)
    with Session(engine) as session:  # rolled back: the shared database stays as it was
        regression = session.scalars(select(Regression).order_by(Regression.id)).first()
        caveat = "heavy contention: the processes ran 22% of their wall time on a CPU ...: judged on CPU time"
        regression.verify_verdict = {**(regression.verify_verdict or {}), "caveat": caveat}
        sent = alerts.payload(regression, "regress")
        # the first line (the explanation's lines follow it)
        assert sent["text"].splitlines()[0].endswith(f"[{caveat}]") and sent["regression"]["caveat"] == caveat
        regression.verify_verdict = {**regression.verify_verdict, "caveat": ""}
        regression.benchmark_verdict = {**(regression.benchmark_verdict or {}), "caveat": ""}
        plain = alerts.payload(regression, "regress")
        assert "[" not in plain["text"].splitlines()[0] and plain["regression"]["caveat"] is None
        session.rollback()
    engine.dispose()


def test_a_tvm_process_runs_on_one_thread_by_default_and_more_threads_are_said_to_cost(tmp_path):
    """On this host's CPU a measured TVM process takes one thread unless its workload (or the
    runner) asks for more; a GPU's host side keeps every core. The report's note says which,
    and what more threads cost under heavy contention."""
    import os

    from abwatch.builders.spec import RunnerConfig
    from abwatch.service.config import ConfigError, TvmWheelBuildConfig, TvmWorkloadConfig, load_config

    cores = os.cpu_count()
    assert RunnerConfig().measured_threads(None, host_cpu=True) == 1
    assert RunnerConfig().measured_threads(None, host_cpu=False) == cores
    assert RunnerConfig(threads="all").measured_threads(None, host_cpu=True) == cores
    assert RunnerConfig(threads=2).measured_threads(3, host_cpu=True) == 3  # the workload's ask comes first
    assert RunnerConfig(threads=2).measured_threads("all", host_cpu=True) == cores

    def note(runner: dict, **workload) -> str:
        config = Config(build=TvmWheelBuildConfig(), runner=runner,
                        workloads=[TvmWorkloadConfig(name="mlp", model="builtin:mlp", **workload)])
        return contended.threads_note(config, config.workloads[0])

    assert note({}) == "1 thread a process (the default: a verdict that stands on a busy host)"
    assert note({"threads": 1}) == "1 thread a process"
    asked = note({}, threads=4)
    assert asked.startswith("4 threads a process (asked for): under heavy contention") and "threads = 1" in asked
    assert note({"threads": "all"}).startswith(f"{cores} threads a process (asked for)") or cores == 1
    assert note({"kind": "gpu"}) == "" and note({}, threads=2) != ""
    # a bad value names its key
    path = tmp_path / "bad.toml"
    path.write_text('[build]\nkind = "tvm-wheel"\n[[workloads]]\nname = "mlp"\nkind = "tvm"\nmodel = "builtin:mlp"\n'
                    "threads = 0\n")
    with pytest.raises(ConfigError, match=r"bad.toml.*workloads.*threads"):
        load_config(path)
