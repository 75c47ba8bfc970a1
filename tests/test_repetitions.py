"""Samples a process chosen from the variance components (service/stats/repetitions.py)."""

from __future__ import annotations

import numpy as np
import pytest

from abwatch.service.stats.repetitions import choose_samples


def _processes(rng, count: int, samples: int, process_sd: float, sample_tail: float) -> list[list[float]]:
    """Processes whose level varies by ``process_sd`` (relative) and whose samples are that level
    plus an exponential tail (interference) of mean ``sample_tail`` (relative)."""
    levels = 1.0 + process_sd * rng.standard_normal(count)
    return [list(level * (1.0 + rng.exponential(sample_tail, samples))) for level in levels]


def test_cheap_processes_with_steady_levels_take_few_samples():
    """Where a process's fixed part is cheap and its fastest sample is reached within a few
    samples, fewer samples reach the same width sooner: the choice goes down, and says so."""
    rng = np.random.default_rng(1)
    processes = _processes(rng, 40, 100, process_sd=0.01, sample_tail=0.002)
    choice = choose_samples(processes, fixed_s=0.01, sample_s=0.002, configured=100)
    assert choice.samples < 100
    best = min(choice.options, key=lambda o: o.relative_time)
    assert choice.samples == best.samples and best.relative_time < 0.8
    assert f"{choice.samples} samples a process (" in choice.reason and "less time to the same width than 100" in choice.reason


def test_dear_processes_keep_many_samples():
    """Where starting a process is what costs (a fresh TVM worker: ~1 s against 1.5 ms a
    sample) and few samples rarely reach the process's floor, the configured count stays."""
    rng = np.random.default_rng(2)
    processes = _processes(rng, 40, 100, process_sd=0.005, sample_tail=0.2)
    choice = choose_samples(processes, fixed_s=1.0, sample_s=0.0015, configured=100)
    assert choice.samples == 100 and choice.reason.startswith("100 samples a process (configured; ")
    assert {o.samples for o in choice.options} == {5, 10, 20, 50, 100}  # none above what was taken
    assert next(o for o in choice.options if o.samples == 100).relative_time == pytest.approx(1.0)


def test_the_first_samples_are_what_a_shorter_process_takes():
    """cv(n) is taken over each process's first n samples, in the order taken: processes whose
    fast samples come after their tenth spread widely at 10 samples and not from 20 on, so 20
    (the cheapest of the steady counts) is chosen."""
    levels = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00]
    late = [[2.0 + i / 10] * 10 + [level] * 90 for i, level in enumerate(levels)]
    choice = choose_samples(late, fixed_s=0.0, sample_s=0.001, configured=100)
    by = {o.samples: o for o in choice.options}
    slow = [2.0 + i / 10 for i in range(6)]  # at 10 samples the fast ones are not reached yet
    assert by[10].process_cv == pytest.approx(np.std(slow, ddof=1) / np.mean(slow))
    assert by[10].process_cv > 3 * by[20].process_cv
    assert by[20].process_cv == pytest.approx(by[100].process_cv)
    assert choice.samples == 20 and by[20].relative_time == pytest.approx(0.2)


@pytest.mark.parametrize(("processes", "fixed", "sample", "configured", "message"), [
    ([[1.0] * 10] * 5, 0.1, 0.001, 10, "at least 6 processes"),
    ([[1.0] * 10] * 6, -1.0, 0.001, 10, "fixed_s must be >= 0"),
    ([[1.0] * 10] * 6, 0.1, 0.0, 10, "sample_s > 0"),
    ([[1.0] * 10] * 6, 0.1, 0.001, 20, "the configured 20 samples, the fewest took 10"),
])
def test_bad_input_is_named(processes, fixed, sample, configured, message):
    with pytest.raises(ValueError, match=message):
        choose_samples(processes, fixed_s=fixed, sample_s=sample, configured=configured)
