#!/usr/bin/env bash
# The load the instruction benchmarks ran under: a parallel compile that keeps both cores of
# this machine busy until killed (two `gcc -O2` of one generated C file at a time, in a loop).
#
#   bash benchmarks/busy_compile.sh & LOAD=$!; ...; kill $LOAD
set -euo pipefail
jobs=${JOBS:-$(nproc)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# ~4000 small functions: each compile takes some seconds, so the load never pauses for long
python3 - "$dir/unit.c" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(4000):
        f.write(f"double f{i}(double x){{double s=0;for(int k=0;k<{i % 13 + 3};k++)s+=x*k/(k+{i}.0);return s;}}\n")
PY
while true; do
    for j in $(seq "$jobs"); do gcc -O2 -c "$dir/unit.c" -o "$dir/unit$j.o" & done
    wait
done
