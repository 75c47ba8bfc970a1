"""Measure the tvm-source builder on a real TVM repository: one clean build, then the next
N consecutive commits built incrementally, and what the artifact cache holds afterwards.

    python -m benchmarks.tvm_source_build --repo /path/to/tvm --commits 10 \\
        --rewrite https://github.com/apache/tvm-ffi=/mirrors/tvm-ffi \\
        --submodule 3rdparty/tvm-ffi --cmake USE_LLVM=OFF --runtime-only

Prints one JSON line per commit (wall and compile seconds, Ninja steps, incremental or
clean, ccache hit rate) and a summary line (time for the commits after the first, cache
bytes against one artifact's bytes). Nothing here runs in CI: it needs a TVM checkout.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from builders import TvmSourceBuilder
from service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig


def _pairs(values: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="TVM repository (path or URL)")
    parser.add_argument("--cache", type=Path, default=Path(".abwatch/tvm-source-bench"))
    parser.add_argument("--ref", default="HEAD", help="newest commit of the series")
    parser.add_argument("--commits", type=int, default=10, help="consecutive commits after the first")
    parser.add_argument("--cmake", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rewrite", action="append", default=[], metavar="PREFIX=MIRROR")
    parser.add_argument("--submodule", action="append", default=None, metavar="PATH")
    parser.add_argument("--runtime-only", action="store_true")
    args = parser.parse_args()
    build = TvmSourceBuildConfig(cmake=_pairs(args.cmake) or {"USE_LLVM": "ON"}, runtime_only=args.runtime_only,
                                 submodules=args.submodule, python_packages=[], submodule_rewrites=_pairs(args.rewrite))
    config = Config(repo=RepoConfig(url=args.repo), cache_dir=args.cache.resolve(), build=build,
                    workloads=[CommandWorkloadConfig(name="none", command=["true"])])
    builder = TvmSourceBuilder(config)
    head = builder.resolve(args.ref).sha
    shas = builder.repo.repo.git.rev_list(f"--max-count={args.commits + 1}", "--first-parent", head).split()[::-1]
    after_first = None
    for i, sha in enumerate(shas):
        started = time.monotonic()
        artifact = builder.build(sha)
        m = artifact.metrics
        print(json.dumps({"commit": i, "sha": sha[:10], "cached": artifact.cached,
                          "wall_s": round(time.monotonic() - started, 1), "compile_s": round(m.get("compile_s", 0), 1),
                          "steps": m.get("steps"), "incremental": m.get("incremental"),
                          "ccache_hit_rate": m.get("ccache_hit_rate")}), flush=True)
        if i == 0:
            after_first = time.monotonic()
    one = sum(p.stat().st_size for p in artifact.path.rglob("*") if p.is_file())
    print(json.dumps({"commits_after_first_s": round(time.monotonic() - after_first, 1),
                      "cache_bytes": builder.cache.size_bytes(), "one_artifact_bytes": one}))


if __name__ == "__main__":
    main()
