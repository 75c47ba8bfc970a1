"""Records in other formats: Parquet export, and import of Ascend AOE tuning reports.

Parquet has the JSONL export's columns, one per top-level v0.1 field, in the same order:
``workload, engine, hardware, runtime_ms_mean, runtime_ms_std, timestamp, schema_version``,
then ``engine_version`` and every object field (``metadata``, ``workload_args``, ...,
``metrics``, ``runtime_raw``). Numbers are float64; objects and lists are JSON text (their
keys differ from record to record, which Parquet structs cannot hold); ``timestamp`` is text
(v0.1 allows a number or a string).

AOE (Ascend's tuning tool) writes ``aoe_result_opat_{timestamp}_{pid}.json`` (operator
tuning) and ``aoe_result_sgat_...`` (subgraph tuning): per operator (subgraph) the time
before and after tuning. :func:`aoe_records` turns one report into two v0.1 records — the
model before tuning and after — whose ``metrics.ops`` hold the operator times and
``metrics.op_features`` the operator types, so ``abwatch`` can compare them like any run.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.core.safejson import BadValue, loads
from abwatch.service.config import format_validation_error
from abwatch.service.store.models import Record
from abwatch.service.records.v01 import (
    CORE_FIELDS, DICT_FIELDS, RecordError, add_new, to_dict, to_row, validate_objects,
)

COLUMNS = (*CORE_FIELDS, "engine_version", *DICT_FIELDS, "runtime_raw")
NUMBERS = ("runtime_ms_mean", "runtime_ms_std")


def export_parquet(session: Session, path: Path, run_id: int | None = None, workload: str | None = None) -> int:
    """Write stored records to a Parquet file at ``path``; return how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    query = select(Record).order_by(Record.id)
    if run_id is not None:
        query = query.where(Record.run_id == run_id)
    if workload is not None:
        query = query.where(Record.workload == workload)
    columns: dict[str, list] = {name: [] for name in COLUMNS}
    for row in session.scalars(query):
        record = to_dict(row)
        for name in COLUMNS:
            value = record.get(name)
            if name in NUMBERS or value is None:
                columns[name].append(value)
            elif name == "timestamp" or name in ("workload", "engine", "hardware", "schema_version",
                                                  "engine_version"):
                columns[name].append(value if isinstance(value, str) else json.dumps(value))
            else:
                columns[name].append(json.dumps(value, sort_keys=True))
    schema = pa.schema([(name, pa.float64() if name in NUMBERS else pa.string()) for name in COLUMNS])
    pq.write_table(pa.table(columns, schema=schema), path)
    return len(columns["workload"])


class _AoeOperator(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    op_name: str = Field(min_length=1)
    op_type: str | list[str]
    after_us: float = Field(alias="performance_after_tune(us)", ge=0)
    before_us: float = Field(alias="performance_before_tune(us)", ge=0)


class _AoeSubgraph(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    repo_key: str = Field(min_length=1)
    after_ms: float = Field(alias="performance_after_tune(ms)", ge=0)
    before_ms: float = Field(alias="performance_before_tune(ms)", ge=0)


class _AoeResult(BaseModel):
    """The OPAT or SGAT section: the model's time before and after, what was tuned."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    baseline_ms: float = Field(alias="model_baseline_performance(ms)", gt=0)
    result_ms: float | None = Field(default=None, alias="model_result_performance(ms)", gt=0)
    tuning_result: str | None = Field(default=None, alias="opat_tuning_result")
    repo_modified_operators: dict[str, list[_AoeOperator]] = Field(default_factory=dict)
    repo_modified_subgraphs: dict[str, list[_AoeSubgraph]] = Field(default_factory=dict)
    repo_summary: dict[str, int] = Field(default_factory=dict)
    tuning_failed_operators: list[str] = Field(default_factory=list)


class _AoeBasic(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tuning_name: str = Field(min_length=1)
    tuning_time_s: float | None = Field(default=None, alias="tuning_time(s)")


def _stamp(path: Path) -> str:
    """The report's time from its file name (``..._{YYYYMMDDhhmmssSSS}_pid...``), else the file's."""
    found = re.search(r"_(\d{17})_", path.name)
    if found:
        when = datetime.strptime(found[1][:14], "%Y%m%d%H%M%S").replace(tzinfo=UTC)
        return when.isoformat()
    return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()


def aoe_records(path: Path, hardware: str = "ascend") -> list[dict[str, Any]]:
    """The v0.1 records (before and after tuning) of one AOE report; a bad report raises
    :class:`RecordError` naming the file and the key."""
    path = Path(path)
    try:
        document = loads(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: cannot read: {exc}") from None
    except BadValue as exc:
        raise RecordError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(document, list) or not all(isinstance(x, dict) for x in document):
        raise RecordError(f"{path}: (top level): expected an AOE report, a JSON array of objects")
    sections = {key: value for part in document for key, value in part.items()}
    kind = "OPAT" if "OPAT" in sections else "SGAT" if "SGAT" in sections else None
    if "basic" not in sections:
        raise RecordError(f"{path}: basic: missing (the report names no tuning task)")
    if kind is None:
        raise RecordError(f"{path}: OPAT or SGAT: missing (nothing was tuned)")
    try:
        basic = _AoeBasic.model_validate(sections["basic"])
    except ValidationError as exc:
        raise RecordError(format_validation_error(f"{path}: basic", exc)) from None
    try:
        result = _AoeResult.model_validate(sections[kind])
    except ValidationError as exc:
        raise RecordError(format_validation_error(f"{path}: {kind}", exc)) from None
    if result.result_ms is None:
        raise RecordError(f"{path}: {kind}.model_result_performance(ms): missing "
                          f"({result.tuning_result or 'tuning interrupted'}: no time after tuning)")
    ops_before, ops_after, features = {}, {}, {}
    for group, operators in result.repo_modified_operators.items():
        for op in operators:
            ops_before[op.op_name], ops_after[op.op_name] = op.before_us, op.after_us
            types = op.op_type if isinstance(op.op_type, list) else [op.op_type]
            features[op.op_name] = {"type": "+".join(types), "aoe_group": group}
    for group, subgraphs in result.repo_modified_subgraphs.items():
        for sg in subgraphs:
            name = f"subgraph:{sg.repo_key}"
            ops_before[name], ops_after[name] = sg.before_ms * 1000.0, sg.after_ms * 1000.0
            features[name] = {"type": "subgraph", "aoe_group": group}
    stamp = _stamp(path)
    records = []
    for phase, runtime, ops in (("before-tuning", result.baseline_ms, ops_before),
                                ("after-tuning", result.result_ms, ops_after)):
        records.append({
            "workload": basic.tuning_name, "engine": "ascend-aoe", "engine_version": phase,
            "hardware": hardware, "runtime_ms_mean": runtime, "runtime_ms_std": 0.0,
            "timestamp": stamp, "schema_version": "0.1",
            "metadata": {"source": f"aoe {kind.lower()} report", "file": path.name, "phase": phase,
                         "tuning_result": result.tuning_result, "tuning_time_s": basic.tuning_time_s,
                         "repo_summary": result.repo_summary,
                         "tuning_failed_operators": result.tuning_failed_operators},
            "metrics": {"ops": ops, "op_features": features},
        })
    return records


def import_aoe(session: Session, path: Path, hardware: str = "ascend") -> tuple[list[Record], int]:
    """Store an AOE report's records, all or nothing; records already stored are skipped
    (returns the stored rows and how many were skipped)."""
    records = validate_objects((f"{path}: {r['engine_version']}", r) for r in aoe_records(path, hardware))
    return add_new(session, [to_row(record) for record in records])
