"""Build and install the tvm-ffi Python package at every pin apache/tvm's history has had.

    python -m benchmarks.tvm_ffi_pins --tvm /mirrors/apache/tvm --rewrite https://github.com/=/mirrors/ \\
        --fallback 3rdparty/tvm-ffi/3rdparty/dlpack=/mirrors/dlpack-from-tvm-ffi-0.1.13 \\
        --ccache-dir .abwatch/ffi-pins/ccache

Walks the first-parent history of ``--ref`` for every distinct commit of ``3rdparty/tvm-ffi``
and, for each, does what the tvm-source builder does when the submodule sits between tags
(``builders.tvm_ffi.install_package``): a git worktree of the submodule at the pin, its own
submodules from the mirrors (or the fallbacks), pip with the build's CMake settings and ccache,
into a fresh venv; then imports ``tvm_ffi`` there. Pins at a release tag are built from source
too (the builder takes those from PyPI). Prints one JSON line per pin and a Markdown table.
Nothing here runs in CI: it needs a TVM repository and minutes per pin.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from abwatch.builders.builder import BuildFailed, failure_lines
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.tvm_ffi import FFI_PATH, FfiState, install_package
from abwatch.builders.build_tools import tool


def _pairs(values: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values)


def pins(tvm: str, ref: str) -> list[tuple[str, str, str]]:
    """(first TVM commit, its date, the pin) for each distinct pin, oldest first."""
    out = subprocess.run(["git", "-C", tvm, "log", "--first-parent", "--reverse", "--format=%H %ad",
                          "--date=short", ref, "--", FFI_PATH], capture_output=True, text=True, check=True).stdout
    seen: dict[str, tuple[str, str, str]] = {}
    for line in out.splitlines():
        commit, date = line.split()
        tree = subprocess.run(["git", "-C", tvm, "ls-tree", commit, FFI_PATH], capture_output=True, text=True).stdout
        if tree.split()[1:2] == ["commit"]:
            seen.setdefault(tree.split()[2], (commit, date, tree.split()[2]))
    return list(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tvm", required=True, help="apache/tvm repository (a local mirror)")
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--ffi", help="the tvm-ffi repository (default: the submodule URL, rewritten)")
    parser.add_argument("--rewrite", action="append", default=[], metavar="PREFIX=MIRROR")
    parser.add_argument("--fallback", action="append", default=[], metavar="SUBMODULE=DIR")
    parser.add_argument("--cmake", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ccache-dir", type=Path, default=Path(".abwatch/ffi-pins/ccache"))
    parser.add_argument("--only", action="append", default=None, metavar="PIN", help="these pins (prefixes) only")
    args = parser.parse_args()
    git = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false"]
    for prefix, mirror in _pairs(args.rewrite).items():
        git += ["-c", f"url.{mirror}.insteadOf={prefix}"]
    fallbacks = {k: Path(v) for k, v in _pairs(args.fallback).items()}
    work = Path(tempfile.mkdtemp(prefix="abwatch-ffi-pins-"))
    ffi_repo = work / "tvm-ffi"  # a clone like the builder's submodule checkout, tags included
    url = args.ffi or "https://github.com/apache/tvm-ffi"
    subprocess.run([*git, "clone", "--quiet", "--no-checkout", url, str(ffi_repo)], check=True)
    env = child_env({"CCACHE_DIR": str(args.ccache_dir.resolve()), "CCACHE_BASEDIR": str(work),
                     "CCACHE_NOHASHDIR": "1"})
    rows = []
    for commit, date, pin in pins(args.tvm, args.ref):
        if args.only and not any(pin.startswith(p) for p in args.only):
            continue
        describe = subprocess.run(["git", "-C", str(ffi_repo), "describe", "--tags", pin],
                                  capture_output=True, text=True).stdout.strip() or "untagged"
        exact = subprocess.run(["git", "-C", str(ffi_repo), "describe", "--tags", "--exact-match", pin],
                               capture_output=True, text=True).stdout.strip()
        ffi = FfiState(ffi_repo, pin, describe, exact.lstrip("v") or None)
        venv = work / f"venv-{pin[:12]}"
        log: list[str] = []

        def step(argv: list[str], what: str, cwd: Path | None, log: list[str] = log) -> str:
            log.append(f"$ {' '.join(argv)}\n")
            proc = run_process(argv, cwd=cwd, env=env, timeout_s=3600, merge_stderr=True)
            log.append(proc.stdout)
            if proc.returncode != 0:
                why = " | ".join(failure_lines(proc.stdout)) or "it printed nothing"
                raise BuildFailed(f"{what} failed (status {proc.returncode}): {why}", "", 0.0)
            return proc.stdout

        started = time.monotonic()
        row = {"tvm_commit": commit[:10], "date": date, "pin": pin[:10], "describe": describe,
               "release": ffi.release is not None}
        try:
            step([sys.executable, "-m", "venv", str(venv)], "venv", None)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
            install_package(step, git, ffi, work / f"src-{pin[:12]}", pip, cmake=_pairs(args.cmake),
                            launcher=tool("ccache"), fallbacks=fallbacks, log=log)
            version = step([str(venv / "bin" / "python"), "-c",
                            "import importlib.metadata as m, tvm_ffi; print(m.version('apache-tvm-ffi'))"],
                           "import tvm_ffi", None).strip().splitlines()[-1]
            row.update(result="installed", version=version)
        except BuildFailed as exc:
            row.update(result="failed", error=str(exc)[:600])
            (work / f"log-{pin[:12]}.txt").write_text("".join(log))
        row["seconds"] = round(time.monotonic() - started, 1)
        shutil.rmtree(venv, ignore_errors=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| TVM commit | date | tvm-ffi pin | `git describe` | result | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        result = f"installed {r['version']}" if r["result"] == "installed" else f"FAILED: {r['error'][:120]}"
        print(f"| `{r['tvm_commit']}` | {r['date']} | `{r['pin']}` | `{r['describe']}`"
              f"{' (release)' if r['release'] else ''} | {result} | {r['seconds']} |")
    print(f"\n{sum(r['result'] == 'installed' for r in rows)} of {len(rows)} pins installed; logs of failures in {work}")


if __name__ == "__main__":
    main()
