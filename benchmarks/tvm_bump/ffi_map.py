"""Map lookups from Python through tvm-ffi: each `m[key]` is one call of ffi.MapGetItem."""
import json
import time

import tvm_ffi

keys = [f"k{i}" for i in range(64)]
m = tvm_ffi.Map({k: i for i, k in enumerate(keys)})
for _ in range(20):  # warm-up
    for k in keys:
        m[k]
for _ in range(30):
    started = time.perf_counter()
    for _ in range(40):
        for k in keys:
            m[k]
    print(json.dumps({"runtime_ms": (time.perf_counter() - started) * 1e3}), flush=True)
