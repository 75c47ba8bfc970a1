"""The harness: balanced interleaved order, and strict parsing of workload output."""

from __future__ import annotations

import json
import random

import pytest

from abwatch.core.sides import CONTROL, TREATMENT
from abwatch.runners.harness import OutputError, interleaved_schedule, parse_output


@pytest.mark.parametrize("repetitions,warmup", [(2, 0), (5, 1), (10, 2), (11, 3)])
def test_schedule_is_balanced_and_warmup_first(repetitions, warmup):
    slots = interleaved_schedule(repetitions, warmup, random.Random(1))
    assert [s.position for s in slots] == list(range(len(slots)))
    assert all(s.warmup for s in slots[: 2 * warmup]) and not any(s.warmup for s in slots[2 * warmup:])
    measured = [s.side for s in slots if not s.warmup]
    assert measured.count(CONTROL) == measured.count(TREATMENT) == repetitions
    # every consecutive pair holds one of each side: never two blocks back to back
    assert all({measured[i], measured[i + 1]} == {CONTROL, TREATMENT} for i in range(0, len(measured), 2))


def test_schedule_is_seeded_and_randomised():
    orders = {tuple(s.side for s in interleaved_schedule(8, 0, random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1
    assert interleaved_schedule(8, 1, random.Random(5)) == interleaved_schedule(8, 1, random.Random(5))


def test_parse_plain_samples_and_records():
    record = {"workload": "w", "runtime_raw": [{"runtime_ms": 1.5}, {"runtime_ms": 2}]}
    samples, records = parse_output('{"runtime_ms": 3.25}\n\n' + json.dumps(record) + "\n")
    assert samples == (3.25, 1.5, 2.0)
    assert records == (record,)


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("hello\n", "output line 1 is not JSON"),
        ("[1, 2]\n", "output line 1 is not a JSON object"),
        ('{"time": 1}\n', "neither runtime_ms nor runtime_raw"),
        ('{"runtime_ms": "fast"}\n', "runtime_ms must be a number"),
        ('{"runtime_ms": NaN}\n', "NaN is not a JSON number"),
        ('{"runtime_ms": -1}\n', "must be between 0 and"),
        ('{"runtime_raw": 5}\n', "runtime_raw must be a list"),
        ("", "printed no samples"),
    ],
)
def test_parse_rejects_bad_output(stdout, message):
    with pytest.raises(OutputError, match=message):
        parse_output(stdout)
