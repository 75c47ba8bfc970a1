"""TVM verdicts on this machine: 0.27.0.post1 A/A and 0.26.0 -> 0.27.0.post1, run time and
compile time, through `abwatch compare` with the default statistics and a time budget.

    nice -n 10 python -m benchmarks.tvm_verdicts --cache DIR [--max-seconds 120] [--repeat 1]

Prints one Markdown row per (pair, workload): the run-time verdict, change and CI, how long it
took and why it stopped; then the compile-time verdict from fresh-process compiles. Each
invocation is a fresh TVM worker process (~2-4 s here), so a workload's verdict takes minutes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PAIRS = (("0.27.0.post1", "0.27.0.post1"), ("0.26.0", "0.27.0.post1"))
CONFIG = """
cache_dir = {cache}
[build]
kind = "tvm-wheel"
[runner]
kind = "cpu"
threads = 1
[run]
repetitions = 8
max_seconds = {max_seconds}
compile_repetitions = {compiles}
noise_aware = false
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [1, 256]
[[workloads]]
name = "matmul"
kind = "tvm"
model = "te:matmul"
options = {{m = 128, k = 128, n = 128}}
"""


def fmt(v: dict) -> str:
    """verdict, change, CI of a result or of its ``compile`` object."""
    if not v or v.get("change_pct") is None:
        return f"{(v or {}).get('verdict', '-')} | - | -"
    ci = v.get("ci_pct")
    return f"{v['verdict']} | {v['change_pct']:+.2f}% | " + (f"{ci[0]:+.2f}..{ci[1]:+.2f}%" if ci else "-")


def pairs(result: dict) -> str:
    """The pairs a run-time verdict used, from its stop reason ("... at look 3, 13 pairs, ...")."""
    found = re.search(r"(\d+) pairs", result.get("stop_reason") or "")
    return found.group(1) if found else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, help="cache_dir holding (or receiving) the two wheel venvs")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--compiles", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--pair", nargs=2, metavar=("CONTROL", "TREATMENT"), help="only this pair")
    args = parser.parse_args()
    abwatch = str(Path(sys.executable).with_name("abwatch"))
    print("| pair | workload | run time: verdict | change | CI | pairs | took, why it stopped | "
          "compile: verdict | change | CI | compiles a side | took, why it stopped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="abwatch-tvm-verdicts-") as tmp:
        config = Path(tmp) / "tvm.toml"
        config.write_text(CONFIG.format(cache=json.dumps(args.cache), max_seconds=args.max_seconds,
                                        compiles=args.compiles))
        for _ in range(args.repeat):
            for control, treatment in ([tuple(args.pair)] if args.pair else PAIRS):
                proc = subprocess.run([abwatch, "compare", "--config", str(config), "--control", control,
                                       "--treatment", treatment, "--json", "--db", f"sqlite:///{tmp}/abwatch.db"],
                                      capture_output=True, text=True)
                if proc.returncode not in (0, 1):
                    print(f"compare {control} -> {treatment} failed ({proc.returncode}): {proc.stderr[-2000:]}",
                          file=sys.stderr)
                    continue
                for r in json.loads(proc.stdout)["results"]:
                    c = r.get("compile") or {}
                    print(f"| {control} -> {treatment} | {r['workload']} | {fmt(r)} | {pairs(r)} | "
                          f"{r['elapsed_s']:.0f}s, {r['stop_reason']} | {fmt(c)} | {(c.get('n') or ['-'])[0]} | "
                          f"{(c.get('elapsed_s') or 0):.0f}s, {c.get('stop_reason', '-')} |", flush=True)


if __name__ == "__main__":
    main()
