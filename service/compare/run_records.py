"""The TVM v0.1 record of one side of one workload in a run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from abwatch.core.device_identity import DeviceInfo
from abwatch.core.sides import Side
from abwatch.runners.workloads import WORKLOAD_KINDS
from abwatch.service.compare.attribution import TvmDetails
from abwatch.service.compare.metrics import record_fields
from abwatch.service.compare.outcome import MetricResult
from abwatch.service.config import Config
from abwatch.service.store.models import Build, Run
from abwatch.service.records.v01 import BenchmarkRecord, to_row


def engine_name(config: Config) -> str:
    """``tvm`` for TVM builds or workloads; else the watched repository's name."""
    if config.build.builds_tvm or any(WORKLOAD_KINDS[w.kind].times_compiles for w in config.workloads):
        return "tvm"
    if config.repo is None:  # only release builds go without a repository, and those are tvm
        return "unknown"
    return config.repo.url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "unknown"


def run_record(config: Config, run: Run, build: Build, side: str, workload, samples: list[float],
               raw: list[dict], given: list[dict], device_info: DeviceInfo, tvm: TvmDetails | None,
               counted: dict | None = None, compile_counted: dict | None = None,
               measured: Sequence[MetricResult] = ()) -> BenchmarkRecord:
    """Build the record; ``given`` are records the workload printed itself (their dict fields
    fill in what abwatch does not know), ``tvm`` the TVM details of the comparison, ``counted``
    its instruction counts (:func:`service.compare.instructions.details`) where it has them,
    ``measured`` the metrics of its timed processes (CPU time, peak memory)."""
    commit = run.control_commit if side == Side.CONTROL else run.treatment_commit
    extra: dict = {}
    for record in given:
        for key, value in record.items():
            if isinstance(value, dict):
                extra.setdefault(key, {}).update(value)
    worker = tvm["workers"][side] if tvm else None
    args, meta, runtime_extra = WORKLOAD_KINDS[workload.kind].record_fields(workload, worker)
    metrics = _side_metrics(side, samples, raw, extra.get("metrics", {}), counted, measured)
    runtime_config = {**extra.get("runtime_config", {}), **device_info.runtime_config}
    engine_config = {**extra.get("engine_config", {}), "builder": build.builder, "build_config_hash": build.config_hash}
    runtime_config.update(runtime_extra)
    if tvm and worker is not None:
        metrics.update(compilation_ms=tvm["compile_ms"][side], max_abs_error=tvm["error"]["max_abs"],
                       max_rel_error=tvm["error"]["max_rel"],
                       ops={op["name"]: op["control_us"] if side == Side.CONTROL else op["treatment_us"]
                            for op in tvm["ops"]},
                       op_features=tvm["op_features"].get(side, {}))
        compiled = compile_counted or {}
        if compiled.get(f"{side}_counts"):  # the compile call's instructions, median of the counted processes
            metrics.update(compilation_instructions_median=statistics.median(compiled[f"{side}_counts"]),
                           instructions_source=compiled["source"])
        runtime_config.update(num_threads=worker.get("num_threads"), target=worker.get("target"))
        engine_config.update(tvm_version=worker.get("tvm_version"), features=worker.get("features"),
                             target=worker.get("target"))
    return BenchmarkRecord(
        workload=workload.name,
        engine=engine_name(config),
        engine_version=commit.sha,
        hardware=device_info.name,
        runtime_ms_mean=statistics.fmean(samples),
        runtime_ms_std=statistics.stdev(samples) if len(samples) > 1 else 0.0,
        timestamp=time.time(),
        schema_version="0.1",
        metadata={**extra.get("metadata", {}), "run_id": run.id, "run_type": run.run_type.value, "side": side,
                  "ref": run.control_ref if side == Side.CONTROL else run.treatment_ref,
                  "commit_summary": commit.summary},
        workload_args={**extra.get("workload_args", {}), **args},
        workload_metadata={**extra.get("workload_metadata", {}), **meta},
        engine_config=engine_config,
        compilation_config={**extra.get("compilation_config", {}), "build_id": build.id,
                            "build_duration_s": build.duration_s, "artifact_key": build.artifact_key},
        software_config=device_info.software_config,
        runtime_config=runtime_config,
        hardware_config=device_info.hardware_config,
        execution_config={"repetitions": len({r["invocation"] for r in raw}), "warmup": config.run.warmup,
                          "timeout_s": workload.timeout_s or config.run.timeout_s,
                          "order": "interleaved ABBA/BAAB blocks", "seed": run.seed},
        metrics=metrics,
        runtime_raw=raw,
    )


def _side_metrics(side: str, samples: list[float], raw: list[dict], given: dict, counted: dict | None,
                  measured: Sequence[MetricResult]) -> dict:
    """A side's record metrics (over the metrics the workload printed, ``given``): its samples'
    median and fastest, its counted instructions, what its timed processes reported."""
    # runtime_ms_fastest: each process's fastest sample, their median (the scale the verdict judges)
    fastest: dict = {}
    for sample in raw:
        fastest[sample["invocation"]] = min(sample["runtime_ms"], fastest.get(sample["invocation"], float("inf")))
    metrics = {**given, "runtime_ms_median": statistics.median(samples),
               "runtime_ms_fastest": statistics.median(fastest.values()) if fastest else None, "n": len(samples)}
    if counted and counted.get(f"{side}_counts"):  # the side's counted processes: their median and counter
        metrics.update(instructions_median=statistics.median(counted[f"{side}_counts"]),
                       instructions_source=counted["source"])
    metrics.update(record_fields(side, measured))  # e.g. max_rss_kib_median, compilation_max_rss_kib_median
    return metrics


def write_records(session, config: Config, run: Run, workload, m, device_info: DeviceInfo, tvm: TvmDetails | None,
                  counted: dict | None, compile_counted: dict | None, measured: Sequence[MetricResult] = ()) -> None:
    """Add one record per side that has timed samples (``m``: the workload's measurement);
    the v0.1 schema requires a run time, so a side counted alone has none."""
    for side in (Side.CONTROL, Side.TREATMENT):
        samples = m.samples[side.value]
        if not samples:
            continue
        raw = [{"runtime_ms": v, "invocation": g} for v, g in zip(samples, m.groups[side.value], strict=True)]
        build = session.get(Build, run.control_build_id if side is Side.CONTROL else run.treatment_build_id)
        if build is None:  # measured sides were built; the run row names their builds
            raise RuntimeError(f"run {run.id}: no build row for its {side.value} side")
        record = run_record(config, run, build, side.value, workload, samples, raw, m.records[side.value],
                            device_info, tvm, counted, compile_counted, measured)
        session.add(to_row(record, run.id, side))
