"""The profile that explains a compile regression, on TVM built from source (its symbols kept).

    python -m benchmarks.tvm_profile --config /srv/abwatch-cache/devices-build.toml --ref HEAD

The config's ``[repo]``/``[build]`` (a ``tvm-source`` build) are used as they are; this script
adds a ``script:`` workload whose treatment module has three more functions to compile (the
same as tests/test_profiles.py does with the release wheel), counted under Valgrind on the
local CPU, the one commit on both sides. Prints the compile regions' totals, the share of the
growth in code without a symbol, and the functions that grew most, demangled: what the
regression page, the API, the pull request's comment and the alert show.
Nothing here runs in CI: it needs a source build (most of an hour) and Valgrind's minutes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = '''
import tvm
from tvm import te


def workload(extra=0):
    """main, and ``extra`` functions compiled but never called: more compile work, the same outputs."""
    def function(name, n):
        a, b = te.placeholder((n,), "float32", "a"), te.placeholder((n,), "float32", "b")
        func = te.create_prim_func([a, b, te.compute((n,), lambda i: a[i] * 2.0 + b[i], name="c")])
        return func.with_attr("global_symbol", name)
    names = ["main", *(f"f{k}" for k in range(extra))]
    return tvm.IRModule({name: function(name, 1024 + k) for k, name in enumerate(names)})
'''
RUN = """
[runner]
kind = "cpu"
device = "profile-x86"
threads = 1
[run]
repetitions = 3
max_repetitions = 3
compile_repetitions = 3
instruction_repetitions = 3
counter = "valgrind"
noise_aware = false
[[workloads]]
name = "extra-functions"
kind = "tvm"
model = "script:{script}"
measure = ["time", "instructions"]
treatment_options = {{options = {{extra = 3}}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a config with a tvm-source [build]")
    parser.add_argument("--ref", default="HEAD", help="the commit on both sides")
    parser.add_argument("--db", default=None)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    base = args.config.read_text()
    kept = re.split(r"^\[(?:runner|run|stats|watch)\]|^\[\[workloads\]\]", base, flags=re.M)[0]
    script = args.config.with_name("profile_extra_functions.py")
    script.write_text(SCRIPT)
    config = args.config.with_name("profile.toml")
    config.write_text(kept + RUN.format(script=script))
    db = args.db or f"sqlite:///{args.config.with_name('profile.db')}"
    proc = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "compare", "--config", str(config), "--control", args.ref,
                           "--treatment", args.ref, "--json", "--db", db], capture_output=True, text=True)
    if not proc.stdout.startswith("{"):
        raise SystemExit(f"compare failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)["results"][0]
    compiled = result["compile_instructions"]
    profile = compiled.get("profile") or {}
    no_symbol = profile.get("no_symbol") or {}
    growth = (profile.get("treatment", {}).get("total", 0) - profile.get("control", {}).get("total", 0))
    print(json.dumps({"verdict": compiled["verdict"], "change_pct": compiled.get("change_pct"),
                      "totals": [profile.get(side, {}).get("total") for side in ("control", "treatment")],
                      "functions_seen": [profile.get(side, {}).get("seen") for side in ("control", "treatment")],
                      "growth": growth, "no_symbol": no_symbol}))
    print("| function (shortened) | control | treatment | growth | share of the change |")
    print("| --- | --- | --- | --- | --- |")
    for row in profile.get("grew", [])[:args.top]:
        print(f"| `{row['short']}` | {row['control']:,} | {row['treatment']:,} | +{row['change']:,} "
              f"({row['change_pct']} %) | {row.get('share_pct')} % |")


if __name__ == "__main__":
    main()
