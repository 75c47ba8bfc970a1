"""The GPU check: A/A and a release pair on a device, through ``abwatch compare`` with the
``gpu`` runner, for the MLP, a TE matmul and the LLM decode workload, with per-operator times.

    python -m benchmarks.gpu --cache /srv/abwatch-gpu                       # CUDA, the wheels
    python -m benchmarks.gpu --cache DIR --wheelhouse /wheels               # no index: pip --find-links
    python -m benchmarks.gpu --cache DIR --target vulkan --config built.toml --aa REF --ab CONTROL:TREATMENT

With no ``--config`` it compares the released apache-tvm wheels (``--aa 0.27.0.post1``, ``--ab
0.26.0:0.27.0.post1``, the ``tvm-wheel`` builder, with the CUDA Python packages TVM's NVRTC path
needs). With ``--config`` the builds are that file's (a ``tvm-source`` build with Vulkan or
OpenCL: docs/devices.md) and only its ``[runner]``, ``[run]`` and ``[[workloads]]`` are replaced.
Prints one JSON line per comparison, then a Markdown table: per workload and metric the
verdict, change and interval, both medians, and the operators that changed most.
Needs the device: nothing here runs in CI (``benchmarks/gpu_check.sh`` runs it on a GPU host).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

WHEEL_BUILD = """
[build]
kind = "tvm-wheel"
packages = {packages}
env = {env}
"""
RUN = """
[runner]
kind = "gpu"
target = {target}
[run]
repetitions = 8
max_seconds = {max_seconds}
compile_repetitions = 0
noise_aware = false
seed = 7
"""
WORKLOADS = """
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [8, 512]
options = {hidden = 1024}
samples = {samples}
[[workloads]]
name = "matmul"
kind = "tvm"
model = "te:matmul"
options = {m = 512, k = 512, n = 512}
samples = {samples}
[[workloads]]
name = "llm-decode"
kind = "tvm"
model = "builtin:llm-decode"
"""
# what TVM's CUDA path needs besides the wheel: NVRTC through cuda-bindings, and the CUDA runtime
CUDA_PACKAGES = ["cuda-bindings", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc"]


def _config(args: argparse.Namespace) -> Path:
    """The config file of the comparisons: the given builds (or the wheels) with this check's runs."""
    # a bare API name as a table, anything longer (``opencl -device=mali``) as TVM's target string
    target = f"{{kind = {json.dumps(args.target)}}}" if args.target.isalpha() else json.dumps(args.target)
    blocks = ["[[workloads]]" + block for block in WORKLOADS.split("[[workloads]]")[1:]]
    workloads = "".join(b for b in blocks if not args.workloads or re.search(r'name = "([^"]+)"', b)[1] in args.workloads)
    if args.config:
        base = args.config.read_text()
        kept = re.split(r"^\[(?:runner|run)\]|^\[\[workloads\]\]", base, flags=re.M)[0]
    else:
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(args.wheelhouse)} if args.wheelhouse else {}
        kept = WHEEL_BUILD.format(packages=json.dumps(CUDA_PACKAGES if args.target == "cuda" else []),
                                  env="{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}")
        kept = f"cache_dir = {json.dumps(str(args.cache))}\n" + kept
    path = args.cache / f"gpu-check-{args.target.split()[0]}.toml"
    args.cache.mkdir(parents=True, exist_ok=True)
    text = kept + RUN.format(target=target, max_seconds=args.max_seconds) + workloads.replace("{samples}", str(args.samples))
    tomllib.loads(text)  # a malformed combination is said here, not by compare
    path.write_text(text)
    return path


def _compare(config: Path, control: str, treatment: str, db: str) -> dict:
    argv = [sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config", str(config), "--control", control,
            "--treatment", treatment, "--json", "--db", db]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if not proc.stdout.startswith("{"):
        raise SystemExit(f"compare {control} -> {treatment} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _ops(result: dict, top: int) -> str:
    rows = [op for op in result.get("ops") or [] if op.get("control_us") is not None]
    rows.sort(key=lambda op: -abs(op.get("share_pct") or 0))
    return "; ".join(f"{op['name']} {op['control_us']:.0f}->{op['treatment_us'] or 0:.0f} us" for op in rows[:top])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _rows(label: str, payload: dict, top: int) -> list[str]:
    lines = []
    for r in payload["results"]:
        ci = r.get("ci_pct")
        lines.append(f"| {label} | {r['workload']} | {r['unit'] or 'ms'} | {r['verdict']} | "
                     f"{_pct(r['change_pct'])} | {f'[{ci[0]:+.1f}, {ci[1]:+.1f}]' if ci else '-'} | "
                     f"{r['control']['median_ms']} | {r['treatment']['median_ms']} | {len(r.get('ops') or [])} | "
                     f"{_ops(r, top) or r.get('failure') or '-'} |")
        for m in r.get("metrics", []):  # the workload's other judged metrics (the LLM's, CPU time, ...)
            ci = m.get("ci_pct")
            lines.append(f"| {label} | {r['workload']} | {m['metric']} ({m['unit']}) | {m['verdict']} | "
                         f"{_pct(m['change_pct'])} | {f'[{ci[0]:+.1f}, {ci[1]:+.1f}]' if ci else '-'} | "
                         f"{m['control']} | {m['treatment']} | | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="cache_dir of the builds (and this check's files)")
    parser.add_argument("--target", default="cuda", help="the device API's target kind (or a target string)")
    parser.add_argument("--config", type=Path, help="a config whose [build] and [repo] to use (default: the wheels)")
    parser.add_argument("--wheelhouse", type=Path, help="install the wheels from this directory only (no index)")
    parser.add_argument("--aa", default="0.27.0.post1", help="the ref of the A/A comparison")
    parser.add_argument("--ab", default="0.26.0:0.27.0.post1", metavar="CONTROL:TREATMENT",
                        help="the release pair ('' for the A/A alone)")
    parser.add_argument("--workloads", nargs="*", help="names of the workloads to run (default: all)")
    parser.add_argument("--max-seconds", type=float, default=120)
    parser.add_argument("--samples", type=int, default=100, help="timed calls per process (fewer on slow devices)")
    parser.add_argument("--top", type=int, default=3, help="operators shown per workload")
    parser.add_argument("--db", default=None, help="database URL (default: SQLite in --cache)")
    args = parser.parse_args()
    args.cache = args.cache.resolve()
    config = _config(args)
    db = args.db or f"sqlite:///{args.cache / 'gpu-check.db'}"
    comparisons = [(f"A/A {args.aa}", (args.aa, args.aa))]
    if args.ab:
        control, treatment = args.ab.split(":", 1)
        comparisons.append((f"{control} -> {treatment}", (control, treatment)))
    lines = ["| comparison | workload | metric | verdict | change | 95 % interval | control | treatment | ops | "
             "operators that changed most (control -> treatment) |", "|" + " --- |" * 10]
    for label, (a, b) in comparisons:
        payload = _compare(config, a, b, db)
        print(json.dumps({"comparison": label, "run_id": payload["run_id"], "status": payload["status"],
                          "results": [{k: r.get(k) for k in ("workload", "verdict", "change_pct", "ci_pct")}
                                      for r in payload["results"]]}), flush=True)
        lines += _rows(label, payload, args.top)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
