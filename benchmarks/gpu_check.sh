#!/usr/bin/env bash
# The GPU check (docs/devices.md): on a machine with an NVIDIA GPU, an A/A and 0.26.0 -> 0.27.0.post1
# on CUDA for the MLP, a TE matmul and the LLM decode workload, with per-operator times; prints
# nvidia-smi's view of the GPU, then benchmarks/gpu.py's JSON lines and table.
#   bash benchmarks/gpu_check.sh [CACHE_DIR] [extra arguments of benchmarks/gpu.py, e.g. --wheelhouse DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-${TMPDIR:-/tmp}/abwatch-gpu-check}
shift || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
[ -x .venv/bin/python ] || { python3 -m venv .venv && .venv/bin/pip install -q -e .; }
exec .venv/bin/python -m benchmarks.gpu --cache "$cache" --target cuda "$@"
