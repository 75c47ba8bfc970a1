"""TVM benchmark records (schema v0.1): seed example round trip, all-or-nothing import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from abwatch.service.cli.main import main
from abwatch.service.store.models import Record
from abwatch.service.records.v01 import RecordError, export_records, import_records

SEED = Path(__file__).parent / "data" / "seed_record_v0_1.json"


def test_seed_example_round_trips_with_no_field_lost(session, tmp_path):
    original = json.loads(SEED.read_text())
    [row], skipped = import_records(session, SEED)
    assert skipped == 0
    assert row.workload == "arcface_resnet100" and row.engine_version == "1.0.0"
    out = tmp_path / "out.jsonl"
    with out.open("w") as handle:
        assert export_records(session, handle, workload="arcface_resnet100") == 1
    [exported] = [json.loads(line) for line in out.read_text().splitlines()]
    assert exported == original


def test_wrong_field_type_rejects_the_whole_file(session, tmp_path):
    good = json.loads(SEED.read_text())
    bad = dict(good, workload="second", runtime_ms_mean="109.4")
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    before = session.scalar(select(func.count()).select_from(Record))
    with pytest.raises(RecordError) as info:
        import_records(session, path)
    assert "mixed.jsonl: line 2: runtime_ms_mean: input should be a valid number" in str(info.value)
    assert session.scalar(select(func.count()).select_from(Record)) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metadata": "docker"}, "metadata: input should be a valid dictionary"),
        ({"schema_version": "0.2"}, "unsupported schema version '0.2'"),
        ({"runtime_ms_std": -1.0}, "runtime_ms_std: value error"),
        ({"runtime_raw": [1, 2]}, "runtime_raw[0]: input should be a valid dictionary"),
    ],
)
def test_invalid_records_name_the_field(session, tmp_path, change, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(dict(json.loads(SEED.read_text()), **change)))
    with pytest.raises(RecordError, match=None) as info:
        import_records(session, path)
    assert message in str(info.value)


def test_missing_field_is_named(session, tmp_path):
    record = json.loads(SEED.read_text())
    del record["hardware"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(RecordError, match=r"r.json: record 1: hardware: field required"):
        import_records(session, path)


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_cli_import_export_on_sqlite(capsys, sqlite_url, tmp_path):
    assert main(["records", "import", str(SEED), "--db", sqlite_url]) == 0
    assert "imported 1 record" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"workload": 1}\n')
    assert main(["records", "import", str(bad), "--db", sqlite_url]) == 2
    assert "bad.jsonl: line 1: workload: input should be a valid string" in capsys.readouterr().err
    out = tmp_path / "all.jsonl"
    assert main(["records", "export", "--format", "jsonl", "-o", str(out), "--db", sqlite_url]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [json.loads(SEED.read_text())]


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_importing_the_same_records_twice_stores_them_once(capsys, sqlite_url, tmp_path):
    """Idempotent by record key (a hash of the record's content), across files and inside one."""
    record = json.loads(SEED.read_text())
    other = dict(record, workload="second")
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join(json.dumps(r) for r in (record, other, record)) + "\n")
    assert main(["records", "import", str(twice), "--db", sqlite_url]) == 0
    err = capsys.readouterr().err
    assert "imported 2 record(s)" in err and "1 already stored, skipped" in err
    assert main(["records", "import", str(SEED), "--db", sqlite_url]) == 0
    err = capsys.readouterr().err
    assert "imported 0 record(s)" in err and "1 already stored, skipped" in err
    out = tmp_path / "all.jsonl"
    assert main(["records", "export", "-o", str(out), "--db", sqlite_url]) == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["workload"] for r in exported) == ["arcface_resnet100", "second"]
    # a changed value is another record
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(dict(record, runtime_ms_mean=record["runtime_ms_mean"] + 1)))
    assert main(["records", "import", str(changed), "--db", sqlite_url]) == 0
    assert "imported 1 record(s)" in capsys.readouterr().err
