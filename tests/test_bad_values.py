"""Values that used to become tracebacks or database errors: refused at the edge with a clear
message and exit 2, the same on SQLite and PostgreSQL, and nothing stored is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from abwatch.runners.harness import OutputError, parse_output
from abwatch.service.cli.main import main

SEED = Path(__file__).parent / "data" / "seed_record_v0_1.json"


def _seed_text(**change) -> str:
    return json.dumps(dict(json.loads(SEED.read_text()), **change))


# (file text, words the error must contain)
BAD_RECORDS = {
    "huge runtime": (_seed_text(runtime_ms_mean=1e308), "runtime_ms_mean"),
    "5000-digit integer": (_seed_text().replace('"runtime_ms_std": ', '"runtime_ms_std": 1' + "0" * 5000 + ", \"x\": "),
                           "digits"),
    "deep nesting": (_seed_text().replace('"metadata": {', '"metadata": {"deep": ' + "[" * 5000 + "]" * 5000 + ", "),
                     "nested deeper"),
    "NaN in metrics": (_seed_text(metrics={"latency": float("nan")}), "NaN is not a JSON number"),
    "Infinity in metrics": (_seed_text(metrics={"latency": float("inf")}), "Infinity is not a JSON number"),
    "NUL in a string": (_seed_text(engine_version="1.0\x00"), "NUL character"),
    "workload longer than its column": (_seed_text(workload="w" * 300), "workload: string should have at most 256"),
    "over-long free text": (_seed_text(metadata={"note": "x" * 70000}), "string of 70000 characters"),
}


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_records_are_refused_and_nothing_stored_is_touched(case, db_url, tmp_path, capsys):
    assert main(["records", "import", str(SEED), "--db", db_url]) == 0
    text, words = BAD_RECORDS[case]
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["records", "import", str(bad), "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert words in err and "bad.json" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # a message, not a dump
    out = tmp_path / "all.jsonl"
    assert main(["records", "export", "--format", "jsonl", "-o", str(out), "--db", db_url]) == 0
    # the stored record is intact and the export is strict JSON (no NaN/Infinity)
    lines = out.read_text().splitlines()
    assert [json.loads(line, parse_constant=lambda c: pytest.fail(c)) for line in lines] == [json.loads(SEED.read_text())]


@pytest.mark.parametrize(("line", "words"), [
    ('{"runtime_ms": 1e308}', "between 0 and"),
    ('{"runtime_ms": 1' + "0" * 5000 + "}", "digits"),
    ('{"runtime_ms": NaN}', "NaN"),
    ('{"runtime_ms": 2, "note": "a\\u0000b"}', "NUL"),
    ("[" * 5000 + "]" * 5000, "nested deeper"),
    ('{"runtime_raw": [{"runtime_ms": -Infinity}]}', "Infinity"),
])
def test_workload_output_with_bad_values_is_an_output_error(line, words):
    with pytest.raises(OutputError, match=words):
        parse_output(line)


def test_cache_dir_that_is_a_file_is_a_config_error(tmp_path, capsys, sqlite_url):
    (tmp_path / "afile").write_text("not a directory")
    config = tmp_path / "c.toml"
    config.write_text(
        'cache_dir = "afile/cache"\n[build]\nkind = "tvm-wheel"\n'
        '[[workloads]]\nname = "mlp"\nkind = "tvm"\nmodel = "builtin:mlp"\n')
    assert main(["compare", "--config", str(config), "--db", sqlite_url,
                 "--control", "0.26.0", "--treatment", "0.27.0.post1"]) == 2
    err = capsys.readouterr().err
    assert "c.toml: cache_dir:" in err and "afile is a file" in err


def test_infinite_numbers_in_a_config_name_the_key(tmp_path, capsys, sqlite_url):
    config = tmp_path / "c.toml"
    config.write_text(
        '[build]\nkind = "tvm-wheel"\n[[workloads]]\nname = "mlp"\nkind = "tvm"\nmodel = "builtin:mlp"\n'
        "[run]\nmax_seconds = inf\n")
    assert main(["compare", "--config", str(config), "--db", sqlite_url,
                 "--control", "0.26.0", "--treatment", "0.27.0.post1"]) == 2
    assert "run.max_seconds" in capsys.readouterr().err
