"""Bisect into a real apache/tvm tvm-ffi bump, as the nightly watch would.

    python -m benchmarks.tvm_bump_bisect --tvm /srv/mirrors/apache/tvm --ffi /srv/mirrors/apache/tvm-ffi \\
        --bump 5b2693d96e --inject 5 --work /srv/tvm-bump.git --ffi-work /srv/mirrors-bump/apache/tvm-ffi \\
        --config benchmarks/tvm_bump/bump.toml --db postgresql+psycopg2://127.0.0.1/abwatch_bump

A pure bump of apache/tvm (a commit that moves ``3rdparty/tvm-ffi`` and nothing else) is
replayed with a slowdown made in one tvm-ffi commit of its range:

1. ``--ffi-work`` (the mirror the config's ``submodule_rewrites`` names for tvm-ffi) gets a
   branch ``abwatch-bump``: the bump parent's pin, then the range's first-parent commits
   cherry-picked in order, the ``--inject``-th (1-based) amended with a delay in
   ``ffi.MapGetItem`` (``src/ffi/container.cc``: every ``Map[key]`` from Python), so every
   commit after it carries the delay too.
2. ``--work`` (the bare repository the config's ``[repo] url`` names) gets the bump's parent as
   ``main``, and the watch tests it (the baseline); then a commit with the bump's message whose
   only change is the gitlink, pointing at the branch's head, becomes ``main``, and one
   ``abwatch watch --once`` finds the regression, verifies it, names the bump and bisects on into
   tvm-ffi.

Prints one JSON line per pass and a summary: the culprit and tvm-ffi commit the watch named
(against the one made slower), each bisection step, and each build (seconds, compile CPU
seconds, Ninja steps, the submodule pin). Nothing here runs in CI: it needs the snapshots and
several TVM builds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from benchmarks.tvm_history import IDENTITY, ensure_database, git, watch_once

CONTAINER = "src/ffi/container.cc"
GET_ITEM = '.def("ffi.MapGetItem", [](const ffi::MapObj* n, const Any& k) -> Any { return n->at(k); })'
# ~150 dependent loads a lookup: tens of nanoseconds on a lookup of a few hundred
SLOW_GET_ITEM = ('.def("ffi.MapGetItem", [](const ffi::MapObj* n, const Any& k) -> Any {\n'
                 '        for (volatile int spin = 0; spin < 150; spin = spin + 1) {\n        }\n'
                 '        return n->at(k);\n      })')
GITLINK = "3rdparty/tvm-ffi"


def _run(cwd: Path, *args: str, date: str | None = None) -> str:
    # a replayed commit keeps its original's dates, so a second run of this script makes the
    # same shas (and finds their builds in the cache)
    env = {**os.environ, **({"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date} if date else {})}
    return subprocess.run(["git", "-C", str(cwd), *IDENTITY, *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def make_ffi_branch(ffi_work: Path, old: str, new: str, inject: int) -> tuple[list[str], str, str]:
    """The branch ``abwatch-bump`` of ``ffi_work``: ``old``, then the first-parent commits of
    ``old..new`` replayed, the ``inject``-th made slower. Returns (replayed shas, the slowed
    one, its subject)."""
    originals = git(ffi_work, "rev-list", "--first-parent", "--reverse", f"{old}..{new}").split()
    if not 1 <= inject <= len(originals):
        raise SystemExit(f"--inject {inject}: the bump's range has {len(originals)} tvm-ffi commits")
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir) / "tvm-ffi"
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ffi_work), str(scratch)], check=True)
        _run(scratch, "checkout", "--quiet", "--detach", old)
        replayed = []
        for index, sha in enumerate(originals, start=1):
            date = git(ffi_work, "log", "-1", "--format=%cI", sha)
            _run(scratch, "cherry-pick", "--allow-empty", "--keep-redundant-commits", sha, date=date)
            if index == inject:
                path = scratch / CONTAINER
                source = path.read_text()
                if GET_ITEM not in source:
                    raise SystemExit(f"{CONTAINER} at {sha[:12]} has no ffi.MapGetItem line to slow down")
                path.write_text(source.replace(GET_ITEM, SLOW_GET_ITEM))
                _run(scratch, "commit", "--quiet", "-a", "--amend", "--no-edit", date=date)
            replayed.append(_run(scratch, "rev-parse", "HEAD"))
        _run(scratch, "push", "--quiet", "--force", "origin", "HEAD:refs/heads/abwatch-bump")
    slowed = replayed[inject - 1]
    return replayed, slowed, git(ffi_work, "log", "-1", "--format=%s", slowed)


def make_bump(work: Path, parent: str, pin: str, message: str, date: str) -> str:
    """A commit on ``parent`` whose one change is the gitlink moved to ``pin``: a pure bump
    (dated ``date``, so the same pin makes the same sha)."""
    with tempfile.TemporaryDirectory() as index_dir:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(index_dir) / "index")}
        base = ["git", "--git-dir", str(work)]
        subprocess.run([*base, "read-tree", parent], check=True, env=env)
        subprocess.run([*base, "update-index", "--cacheinfo", f"160000,{pin},{GITLINK}"], check=True, env=env)
        tree = subprocess.run([*base, "write-tree"], check=True, env=env, capture_output=True,
                              text=True).stdout.strip()
    dated = {**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
    return subprocess.run(["git", "--git-dir", str(work), *IDENTITY, "commit-tree", tree, "-p", parent, "-m", message],
                          check=True, capture_output=True, text=True, env=dated).stdout.strip()


def report(db: str) -> dict:
    """What the watch stored: the regressions and their culprits, the steps, the builds."""
    engine = create_engine(db)
    with engine.connect() as conn:
        regressions = conn.execute(text(
            "SELECT r.id, w.name AS workload, r.state, r.change_pct, c.sha AS culprit, c.summary AS culprit_summary, "
            "r.culprit_submodule_path, s.sha AS submodule_sha, s.summary AS submodule_summary "
            "FROM regressions r JOIN workloads w ON w.id = r.workload_id "
            "LEFT JOIN commits c ON c.id = r.culprit_commit_id "
            "LEFT JOIN commits s ON s.id = r.culprit_submodule_commit_id ORDER BY r.id")).mappings().all()
        steps = conn.execute(text(
            "SELECT b.position, c.sha, s.sha AS submodule_sha, b.side, b.verdict, b.change_pct FROM bisection_steps b "
            "JOIN commits c ON c.id = b.commit_id LEFT JOIN commits s ON s.id = b.submodule_commit_id "
            "ORDER BY b.id")).mappings().all()
        builds = conn.execute(text(
            "SELECT b.id, c.sha, b.submodule_pin, b.status, b.duration_s, b.cached, b.metrics FROM builds b "
            "JOIN commits c ON c.id = b.commit_id ORDER BY b.id")).mappings().all()
    engine.dispose()

    def metrics(row):
        m = row["metrics"] if isinstance(row["metrics"], dict) else json.loads(row["metrics"] or "{}")
        return {"compile_s": m.get("compile_s"), "steps": m.get("steps"), "incremental": m.get("incremental")}

    return {
        "regressions": [{k: (str(v) if v is not None else None) for k, v in r.items()} for r in regressions],
        "steps": [{k: (str(v) if v is not None else None) for k, v in s.items()} for s in steps],
        "builds": [{"sha": b["sha"][:10], "pin": b["submodule_pin"], "status": str(b["status"]),
                    "wall_s": b["duration_s"] and round(float(b["duration_s"]), 1), "cached": b["cached"],
                    **metrics(b)} for b in builds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tvm", type=Path, required=True, help="apache/tvm repository (a snapshot)")
    parser.add_argument("--ffi", type=Path, required=True, help="apache/tvm-ffi repository (a snapshot)")
    parser.add_argument("--bump", required=True, help="a pure tvm-ffi bump of --tvm")
    parser.add_argument("--inject", type=int, required=True, help="which commit of the range is made slower (1-based)")
    parser.add_argument("--work", type=Path, required=True, help="bare repository the config's [repo] url names")
    parser.add_argument("--ffi-work", type=Path, required=True, help="tvm-ffi mirror the config's rewrites name")
    parser.add_argument("--config", required=True)
    parser.add_argument("--db", required=True, help="PostgreSQL URL (created if absent)")
    args = parser.parse_args()
    for repo, into in ((args.tvm, args.work), (args.ffi, args.ffi_work)):
        if not into.exists():
            subprocess.run(["git", "clone", "--quiet", "--bare", "--no-hardlinks", str(repo), str(into)], check=True)
    bump = git(args.work, "rev-parse", args.bump)
    parent = git(args.work, "rev-parse", f"{bump}^")
    old, new = git(args.work, "rev-parse", f"{parent}:{GITLINK}"), git(args.work, "rev-parse", f"{bump}:{GITLINK}")
    changed = git(args.work, "diff", "--name-only", parent, bump).split()
    if changed != [GITLINK]:
        raise SystemExit(f"{args.bump} is not a pure bump: it changes {changed[:5]}")
    replayed, slowed, subject = make_ffi_branch(args.ffi_work, old, new, args.inject)
    made = make_bump(args.work, parent, replayed[-1], git(args.work, "log", "-1", "--format=%B", bump),
                     git(args.work, "log", "-1", "--format=%cI", bump))
    ensure_database(args.db)
    subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "db", "upgrade", "--db", args.db], check=True,
                   capture_output=True)  # a database an earlier abwatch made: at this abwatch's schema
    print(json.dumps({"bump": bump[:10], "parent": parent[:10], "replayed_bump": made[:10], "ffi_commits": len(replayed),
                      "slowed": slowed[:10], "slowed_subject": subject}), flush=True)

    git(args.work, "update-ref", "refs/heads/main", parent)
    code, wall, err = watch_once(args.config, args.db)
    print(json.dumps({"pass": "baseline", "sha": parent[:10], "exit": code, "wall_s": round(wall, 1),
                      **({"stderr": err} if code > 1 else {})}), flush=True)
    git(args.work, "update-ref", "refs/heads/main", made)
    started = time.monotonic()
    code, wall, err = watch_once(args.config, args.db)
    found = report(args.db)
    named = [r for r in found["regressions"] if r["submodule_sha"] == slowed]
    print(json.dumps({"pass": "bump", "sha": made[:10], "exit": code, "pass_to_culprit_s": round(time.monotonic() - started, 1),
                      **found, "named_slowed": bool(named),
                      "submodule_builds": sum(1 for b in found["builds"] if b["pin"]),
                      **({"stderr": err} if code > 1 else {})}), flush=True)


if __name__ == "__main__":
    main()
