"""Parquet export (the JSONL export's columns) and Ascend AOE tuning reports as records."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from sqlalchemy import func, select

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.records.interchange import COLUMNS
from abwatch.service.store.models import Record

DATA = Path(__file__).resolve().parent / "data"
OPAT = DATA / "aoe_result_opat_20231108120501123_pid4242.json"
SGAT = DATA / "aoe_result_sgat_20231108130000456_pid77.json"


def test_parquet_has_the_jsonl_columns_and_values(filled_pg_url, tmp_path, capsys):
    url, runs = filled_pg_url
    jsonl, parquet = tmp_path / "r.jsonl", tmp_path / "r.parquet"
    assert main(["records", "export", "--db", url, "--run", str(runs["regression"]), "-o", str(jsonl)]) == 0
    assert main(["records", "export", "--format", "parquet", "--db", url, "--run", str(runs["regression"]),
                 "-o", str(parquet)]) == 0
    expected = [json.loads(line) for line in jsonl.read_text().splitlines()]
    table = pq.read_table(parquet)
    assert tuple(table.column_names) == COLUMNS
    assert table.schema.field("runtime_ms_mean").type == "double"
    rows = table.to_pylist()
    assert len(rows) == len(expected) == 2
    for row, record in zip(rows, expected, strict=False):
        assert set(record) <= set(COLUMNS)
        for key, value in record.items():
            cell = row[key]
            if isinstance(value, (dict, list)) or key == "timestamp" and not isinstance(value, str):
                cell = json.loads(cell)
            assert cell == value, key
    assert main(["records", "export", "--format", "parquet", "--db", url]) == 2
    assert "--output" in capsys.readouterr().err


def test_aoe_operator_report_becomes_before_and_after_records(sqlite_url, capsys):
    assert main(["records", "import", "--format", "aoe", "--hardware", "atlas-300i", str(OPAT),
                 "--db", sqlite_url]) == 0
    assert "imported 2 record(s)" in capsys.readouterr().err
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        before, after = session.scalars(select(Record).order_by(Record.id))
        assert (before.workload, before.hardware, before.engine) == ("resnet50_opat", "atlas-300i", "ascend-aoe")
        assert (before.engine_version, after.engine_version) == ("before-tuning", "after-tuning")
        assert (before.runtime_ms_mean, after.runtime_ms_mean) == (113.588725, 113.236731)
        assert before.timestamp == "2023-11-08T12:05:01+00:00"
        conv = "test/conv1/conv1_2/Conv2Dtest/conv1/conv1_2/Relu"
        assert before.fields["metrics"]["ops"][conv] == 13446.145
        assert after.fields["metrics"]["ops"][conv] == 13114.24
        assert after.fields["metrics"]["op_features"][conv]["type"] == "conv2d+relu"
        assert after.fields["metrics"]["ops"]["strided_slice_7"] == 14
        assert before.fields["metadata"]["repo_summary"]["total_num"] == 19
    engine.dispose()


def test_aoe_subgraph_report(sqlite_url):
    assert main(["records", "import", "--format", "aoe", str(SGAT), "--db", sqlite_url]) == 0
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        before, after = session.scalars(select(Record).order_by(Record.id))
        assert after.fields["metrics"]["ops"]["subgraph:1024942313106057586"] == 2573.203
        assert before.runtime_ms_mean == 5.600486
    engine.dispose()


def test_a_bad_aoe_report_stores_nothing_and_names_the_key(sqlite_url, tmp_path, capsys):
    report = json.loads(OPAT.read_text())
    report[1]["OPAT"]["repo_modified_operators"]["update_repo_operators"][1]["performance_after_tune(us)"] = "fast"
    bad = tmp_path / "aoe_result_opat_20231108120501123_pid1.json"
    bad.write_text(json.dumps(report))
    assert main(["records", "import", "--format", "aoe", str(bad), "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "OPAT: repo_modified_operators.update_repo_operators[1]" in err
    incomplete = json.loads(OPAT.read_text())
    del incomplete[1]["OPAT"]["model_result_performance(ms)"]
    incomplete[1]["OPAT"]["opat_tuning_result"] = "tuning incomplete"
    bad.write_text(json.dumps(incomplete))
    assert main(["records", "import", "--format", "aoe", str(bad), "--db", sqlite_url]) == 2
    assert "model_result_performance(ms): missing (tuning incomplete: no time after tuning)" in capsys.readouterr().err
    bad.write_text(OPAT.read_text()[:-20])
    assert main(["records", "import", "--format", "aoe", str(bad), "--db", sqlite_url]) == 2
    assert "invalid JSON" in capsys.readouterr().err
    engine = db.make_engine(sqlite_url)
    with db.session_scope(engine) as session:
        assert session.scalar(select(func.count()).select_from(Record)) == 0
    engine.dispose()
