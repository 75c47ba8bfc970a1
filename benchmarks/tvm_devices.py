"""apache/tvm built from source with Vulkan and OpenCL, measured on real drivers (Mesa's
lavapipe, pocl): an A/A, and a regression made in a script workload found, verified and
bisected by the watch, with per-operator times on the device.

    python -m benchmarks.tvm_devices --tvm /srv/tvm-devices --work /srv/tvm-devices-work.git \\
        --build-config /srv/abwatch-cache/devices-build.toml --target vulkan \\
        --db postgresql://127.0.0.1/abwatch_devices

``--build-config`` gives the ``tvm-source`` build (``USE_VULKAN``/``USE_OPENCL``: docs/devices.md);
this script adds the runner, the workloads and the watch. ``--work`` is a bare repository made
from ``--tvm``'s head with six commits on top: the first adds ``abwatch-bench/matmul_gpu.py``
(a 512x512 matmul scheduled by dlight's Matmul rule for the current target), the fourth turns
it to dlight's Fallback rule (one thread per output, no tiling: the worse schedule), the others
touch only a README. Steps, one JSON line each:

1. A/A: ``abwatch compare`` of the first commit with itself (``same`` expected everywhere).
2. The watch: ``main`` at the first commit (the baseline pass), then at the sixth: the pass
   finds the slowdown, verifies it and bisects the five commits; prints the culprit it named.
3. Per-operator times of ``builtin:mlp`` on the device (from the A/A run's comparisons).

Nothing here runs in CI: the source build takes most of an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from benchmarks.tvm_history import IDENTITY, ensure_database, git, watch_once

SCRIPT = '''"""A 512x512 float32 matmul, scheduled for the runner's GPU by TVM's dlight rules.

abwatch calls workload() with the runner's target current, so dlight schedules for it.
"""
import tvm
from tvm import te

try:
    from tvm.s_tir import dlight as dl
except ImportError:  # releases before the s_tir package
    from tvm import dlight as dl


def rules():
    """The dlight rules tried in order on the kernel."""
    return [{rules}]


def workload(n=512):
    """The scheduled kernel (C = A @ B; its last parameter is the output)."""
    a = te.placeholder((n, n), "float32", name="A")
    b = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({{"main": te.create_prim_func([a, b, c])}})
    return dl.ApplyDefaultSchedule(*rules())(mod)
'''
GOOD, WORSE = "dl.gpu.Matmul(), dl.gpu.Fallback()", "dl.gpu.Fallback()"
RUN = """
[runner]
kind = "gpu"
device = "{device}"
target = {{kind = "{target}"}}
[run]
repetitions = 8
max_seconds = {max_seconds}
compile_repetitions = 0
[stats]
threshold_pct = 5.0
[watch]
schedule = "0 2 * * *"
control = "previous"
max_builds_per_range = 8
[[workloads]]
name = "matmul-script"
kind = "tvm"
model = "script:repo:abwatch-bench/matmul_gpu.py"
samples = 10
[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
input_shape = [4, 256]
options = {{hidden = 512}}
samples = 20
[[workloads]]
name = "matmul-te"
kind = "tvm"
model = "te:matmul"
options = {{m = 256, k = 256, n = 256}}
samples = 20
"""


def make_history(tvm: Path, work: Path) -> list[str]:
    """The work repository: ``tvm``'s head and six commits on top; their shas, oldest first."""
    scratch = work.parent / (work.name + "-scratch")
    subprocess.run(["rm", "-rf", str(work), str(scratch)], check=True)
    subprocess.run(["git", "clone", "--quiet", "--bare", str(tvm), str(work)], check=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(work), str(scratch)], check=True)

    def run(*args: str) -> str:
        return subprocess.run(["git", "-C", str(scratch), *IDENTITY, *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    run("checkout", "--quiet", "--detach", "HEAD")
    bench = scratch / "abwatch-bench"
    bench.mkdir()
    steps = [("add a GPU matmul script workload (dlight Matmul rule)", GOOD, "benchmark notes\n"),
             ("notes: how the script is timed", GOOD, "benchmark notes\ntimed by abwatch's gpu runner\n"),
             ("notes: the sizes", GOOD, "benchmark notes\ntimed by abwatch's gpu runner\n512x512 float32\n"),
             ("schedule the matmul with dlight's Fallback rule", WORSE,
              "benchmark notes\ntimed by abwatch's gpu runner\n512x512 float32\n"),
             ("notes: the target", WORSE, "benchmark notes\ntimed by abwatch's gpu runner\n512x512 float32\ntarget\n"),
             ("notes: done", WORSE, "benchmark notes\ntimed by abwatch's gpu runner\n512x512 float32\ntarget\ndone\n")]
    shas = []
    for message, rules, notes in steps:
        (bench / "matmul_gpu.py").write_text(SCRIPT.format(rules=rules))
        (bench / "README.md").write_text(notes)
        run("add", "abwatch-bench")
        run("commit", "--quiet", "-m", f"[bench] {message}")
        shas.append(run("rev-parse", "HEAD"))
    run("push", "--quiet", "--force", "origin", f"{shas[-1]}:refs/heads/bench")
    return shas


def write_config(args: argparse.Namespace) -> Path:
    """The build config's ``[repo]``/``[build]`` (pointed at the work repository) and this benchmark's runs."""
    base = args.build_config.read_text()
    kept = re.split(r"^\[(?:runner|run|stats|watch)\]|^\[\[workloads\]\]", base, flags=re.M)[0]
    kept = re.sub(r'^url = .*$', f"url = {json.dumps(str(args.work))}\nbranch = \"main\"", kept, count=1, flags=re.M)
    kept = kept.replace('kind = "tvm-source"', 'kind = "tvm-source"\nkeep = ["abwatch-bench"]', 1)
    path = args.build_config.with_name(f"devices-{args.target}.toml")
    path.write_text(kept + RUN.format(device=f"lavapipe-{args.target}" if args.target == "vulkan" else f"pocl-{args.target}",
                                      target=args.target, max_seconds=args.max_seconds))
    return path


def compare(config: Path, db: str, control: str, treatment: str) -> dict:
    """One ``abwatch compare`` (JSON)."""
    proc = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config", str(config), "--control", control,
                           "--treatment", treatment, "--json", "--db", db], capture_output=True, text=True)
    if not proc.stdout.startswith("{"):
        raise SystemExit(f"compare failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tvm", type=Path, required=True, help="apache/tvm repository (a snapshot)")
    parser.add_argument("--work", type=Path, required=True, help="bare repository made here for the watch")
    parser.add_argument("--build-config", type=Path, required=True, help="config with the tvm-source [build]")
    parser.add_argument("--target", default="vulkan", choices=["vulkan", "opencl"])
    parser.add_argument("--db", required=True, help="PostgreSQL URL (made if missing)")
    parser.add_argument("--max-seconds", type=float, default=90)
    parser.add_argument("--skip", nargs="*", default=[], choices=["aa", "watch"])
    args = parser.parse_args()
    shas = make_history(args.tvm, args.work)
    config = write_config(args)
    ensure_database(args.db)
    print(json.dumps({"history": [s[:10] for s in shas], "culprit": shas[3][:10], "config": str(config)}), flush=True)
    if "aa" not in args.skip:
        payload = compare(config, args.db, shas[0], shas[0])
        print(json.dumps({"part": "A/A", "run_id": payload["run_id"], "status": payload["status"], "results": [
            {"workload": r["workload"], "verdict": r["verdict"], "change_pct": r["change_pct"], "ci_pct": r["ci_pct"],
             "control_ms": r["control"]["median_ms"], "ops": [(o["name"], o["control_us"]) for o in r.get("ops") or []]}
            for r in payload["results"]]}), flush=True)
    if "watch" not in args.skip:
        git(args.work, "update-ref", "refs/heads/main", shas[0])
        code, wall, err = watch_once(str(config), args.db)
        print(json.dumps({"part": "baseline", "sha": shas[0][:10], "exit": code, "wall_s": round(wall, 1),
                          **({"stderr": err} if code > 1 else {})}), flush=True)
        git(args.work, "update-ref", "refs/heads/main", shas[-1])
        started = time.monotonic()
        code, wall, err = watch_once(str(config), args.db)
        engine = create_engine(args.db)
        with engine.connect() as conn:
            found = conn.execute(text(
                "SELECT workload, kind, state, change_pct, good_sha, bad_sha, culprit_sha, culprit_summary "
                "FROM regression_history ORDER BY regression_id")).mappings().all()
            steps = conn.execute(text("SELECT count(*) FROM bisection_steps")).scalar()
        engine.dispose()
        print(json.dumps({"part": "watch", "head": shas[-1][:10], "exit": code, "wall_s": round(wall, 1),
                          "to_culprit_s": round(time.monotonic() - started, 1), "bisection_steps": steps,
                          "regressions": [{k: (str(v) if v is not None else None) for k, v in r.items()} for r in found],
                          "named_culprit": any(r["culprit_sha"] == shas[3] for r in found),
                          **({"stderr": err} if code > 1 else {})}), flush=True)


if __name__ == "__main__":
    main()
