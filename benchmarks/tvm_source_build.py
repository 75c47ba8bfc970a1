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

from abwatch.builders import BuildFailed, TvmSourceBuilder
from abwatch.builders.sandbox import policy
from abwatch.builders.wheelhouse import wheelhouse
from abwatch.service.config import CommandWorkloadConfig, Config, RepoConfig, TvmSourceBuildConfig


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
    parser.add_argument("--packages", choices=("none", "default"), default="none",
                        help="the artifact's Python packages: none, or the builder's defaults (numpy, "
                             "apache-tvm-ffi at the submodule's release or built from its source, ...)")
    parser.add_argument("--check-import", default=None, help="module imported after each build (tvm, tvm_ffi)")
    parser.add_argument("--fallback", action="append", default=[], metavar="PATH=DIR",
                        help="submodule_fallbacks entry")
    parser.add_argument("--only", action="append", default=[], metavar="SHA",
                        help="build these commits (in order) instead of a consecutive series")
    args = parser.parse_args()
    extra = {} if args.packages == "default" else {"python_packages": []}
    if args.check_import is not None:
        extra["check_import"] = args.check_import
    build = TvmSourceBuildConfig(cmake=_pairs(args.cmake) or {"USE_LLVM": "ON"}, runtime_only=args.runtime_only,
                                 submodules=args.submodule, submodule_rewrites=_pairs(args.rewrite),
                                 submodule_fallbacks=_pairs(args.fallback), **extra)
    config = Config(repo=RepoConfig(url=args.repo), cache_dir=args.cache.resolve(), build=build,
                    workloads=[CommandWorkloadConfig(name="none", command=["true"])])
    builder = TvmSourceBuilder(config)
    head = builder.resolve(args.ref).sha
    shas = builder.repo.repo.git.rev_list(f"--max-count={args.commits + 1}", "--first-parent", head).split()[::-1]
    if args.only:
        shas = [builder.resolve(ref).sha for ref in args.only]
    rules = policy()
    print(json.dumps({"sandbox": rules.enabled, "user": rules.user, "build_network": rules.build_network}), flush=True)
    walls, artifacts = [], []
    for i, sha in enumerate(shas):
        started = time.monotonic()
        try:
            artifact = builder.build(sha)
        except BuildFailed as exc:  # a data point too: say why, go on with the next commit
            walls.append(time.monotonic() - started)
            print(json.dumps({"commit": i, "sha": sha[:10], "failed": str(exc), "log_tail": exc.log[-2000:]}),
                  flush=True)
            continue
        walls.append(time.monotonic() - started)
        artifacts.append(artifact)
        m = artifact.metrics
        wheels = sorted(p.name for p in wheelhouse(builder.cache_dir).glob("*.whl"))
        print(json.dumps({"commit": i, "sha": sha[:10], "cached": artifact.cached, "wall_s": round(walls[-1], 1),
                          "compile_s": round(m.get("compile_s", 0), 1), "steps": m.get("steps"),
                          "incremental": m.get("incremental"), "ccache_hit_rate": m.get("ccache_hit_rate"),
                          "cache_bytes": builder.cache.size_bytes(), "wheelhouse": wheels}), flush=True)
    # one artifact's bytes: the newest, whose files are all whole
    one = sum(p.stat().st_size for p in artifacts[-1].path.rglob("*") if p.is_file())
    cache_bytes = builder.cache.size_bytes()
    windows = [sum(walls[k:k + 10]) for k in range(1, len(walls) - 9)]  # ten consecutive, after the clean one
    started = time.monotonic()
    builder.cache.get(artifacts[0].key)  # the oldest: rebuilt through the longest chain of deltas
    rebuild_s = time.monotonic() - started
    print(json.dumps({"commits_after_first_s": round(sum(walls[1:]), 1),
                      "ten_commit_windows_s": [round(w, 1) for w in windows],
                      "cache_bytes": cache_bytes, "one_artifact_bytes": one, "ratio": round(cache_bytes / one, 2),
                      "rebuild_oldest_s": round(rebuild_s, 2)}))

if __name__ == "__main__":
    main()
