"""Watch a real window of apache/tvm history, built from source, as the nightly watch would.

    python -m benchmarks.tvm_history --tvm /path/to/apache-tvm.git --base 850807b904 --commits 11 \\
        --config nightly.toml --work /srv/tvm-watch.git --db postgresql://127.0.0.1/abwatch_history

The config's ``[repo] url`` must be ``--work``: a bare repository this script makes from
``--tvm`` and whose ``main`` it moves. Two parts:

1. **The window** (``--commits`` first-parent commits after ``--base``): ``main`` is moved one
   commit at a time and ``abwatch watch --once`` runs after each move (the config's
   ``[watch] schedule`` makes it test the head against the previous head). One JSON line per
   commit: build seconds (incremental), run-time and compile-time verdicts per workload, wall.
2. **A regression made on top of that history** (``--inject-at K``): a commit that turns the
   LLVM code generator's default optimization level from ``Aggressive`` to ``None`` (in
   ``src/target/llvm/llvm_instance.cc``) is placed after the window's K-th commit and the rest of the window is replayed on top of it. With a fresh
   database (``--db`` + ``_regress``) the watch sees the window's head arrive at once, finds
   the regression, verifies it and bisects it; the script prints the culprit the watch named
   and the time from the pass's start to the culprit.

Nothing here runs in CI: it needs a TVM snapshot, LLVM and about an hour for the first build.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine, text

LLVM_INSTANCE = "src/target/llvm/llvm_instance.cc"
FAST = "static const llvm::CodeGenOptLevel opt_level = llvm::CodeGenOptLevel::Aggressive;"
IDENTITY = ["-c", "user.name=abwatch benchmark", "-c", "user.email=benchmark@abwatch.invalid"]


def git(work: Path, *args: str) -> str:
    """``git`` in the bare work repository (argument lists only)."""
    return subprocess.run(["git", "--git-dir", str(work), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def watch_once(config: str, db: str) -> tuple[int, float, str]:
    """One ``abwatch watch --once`` pass: exit status, wall seconds, stderr tail."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", "watch", "--config", config, "--once",
                           "--db", db], capture_output=True, text=True)
    return proc.returncode, time.monotonic() - started, proc.stderr[-3000:]


def commit_row(db: str, sha: str) -> dict:
    """What the database says of ``sha``: its build and the verdicts of the run that tested it."""
    engine = create_engine(db)
    with engine.connect() as conn:
        build = conn.execute(text(
            "SELECT b.status, b.duration_s, b.cached, b.metrics FROM builds b JOIN commits c ON c.id = b.commit_id "
            "WHERE c.sha = :sha ORDER BY b.id DESC LIMIT 1"), {"sha": sha}).mappings().first()
        rows = conn.execute(text(
            "SELECT w.name, cmp.verdict, cmp.change_pct, cmp.details FROM comparisons cmp "
            "JOIN runs r ON r.id = cmp.run_id JOIN commits c ON c.id = r.treatment_commit_id "
            "JOIN workloads w ON w.id = cmp.workload_id WHERE c.sha = :sha AND r.run_type = 'benchmark' "
            "ORDER BY cmp.id"), {"sha": sha}).mappings().all()
    engine.dispose()
    verdicts = {}
    for row in rows:
        details = row["details"] if isinstance(row["details"], dict) else json.loads(row["details"] or "{}")
        compile_verdict = details.get("compile") or {}
        verdicts[row["name"]] = {
            "run": row["verdict"], "run_pct": _round(row["change_pct"]),
            "compile": compile_verdict.get("verdict"), "compile_pct": _round(compile_verdict.get("change_pct"))}
    metrics = (build or {}).get("metrics") or {}
    if isinstance(metrics, str):
        metrics = json.loads(metrics)
    return {"build_status": build and build["status"], "build_s": _round(build and build["duration_s"]),
            "cached": build and build["cached"], "steps": metrics.get("steps"), "verdicts": verdicts}


def ensure_database(url: str) -> None:
    """Create the PostgreSQL database ``url`` names if it is not there (the watch migrates it)."""
    server, _, name = url.rpartition("/")
    engine = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar():
            conn.execute(text(f'CREATE DATABASE "{name}"'))  # a name from the command line, quoted
    engine.dispose()


def _round(value):
    return None if value is None else round(float(value), 2)


def window(args, shas: list[str]) -> None:
    """Part 1: the window, one commit a pass."""
    for index, sha in enumerate(shas):
        git(args.work, "update-ref", "refs/heads/main", sha)
        code, wall, err = watch_once(args.config, args.db)
        summary = git(args.work, "log", "-1", "--format=%s", sha)
        row = {"commit": index, "sha": sha[:10], "summary": summary[:70], "exit": code, "wall_s": round(wall, 1),
               **commit_row(args.db, sha)}
        if code > 1:
            row["stderr"] = err
        print(json.dumps(row), flush=True)


def inject(args, shas: list[str]) -> tuple[str, str]:
    """Part 2's history: the window up to ``--inject-at``, the regression, the rest replayed on top.
    Returns (culprit sha, new head)."""
    base = shas[args.inject_at]
    scratch = args.work.parent / (args.work.name + "-scratch")
    subprocess.run(["rm", "-rf", str(scratch)], check=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(args.work), str(scratch)], check=True)
    run = lambda *a: subprocess.run(["git", "-C", str(scratch), *IDENTITY, *a], check=True,  # noqa: E731
                                    capture_output=True, text=True).stdout.strip()
    run("checkout", "--quiet", "--detach", base)
    path = scratch / LLVM_INSTANCE
    source = path.read_text()
    if FAST not in source:
        raise SystemExit(f"{LLVM_INSTANCE} at {base[:12]} has no default opt level line to change")
    # LLVM's code generation without optimization: measured +30 % on the MLP with opt-level=0
    path.write_text(source.replace(FAST, FAST.replace("Aggressive", "None")))
    run("commit", "--quiet", "-a", "-m", "[LLVM] Default code generation to CodeGenOptLevel::None")
    culprit = run("rev-parse", "HEAD")
    for sha in shas[args.inject_at + 1:]:
        run("cherry-pick", "--allow-empty", "--keep-redundant-commits", sha)
    head = run("rev-parse", "HEAD")
    run("push", "--quiet", "--force", "origin", "HEAD:refs/heads/regressed")
    return culprit, head


def regression(args, shas: list[str]) -> None:
    """Part 2: the watch finds, verifies and bisects the injected regression."""
    culprit, head = inject(args, shas)
    db = args.db + "_regress"
    git(args.work, "update-ref", "refs/heads/main", shas[args.inject_at])
    code, wall, err = watch_once(args.config, db)  # the baseline: the last good commit
    print(json.dumps({"part": "regress", "baseline": shas[args.inject_at][:10], "exit": code,
                      "wall_s": round(wall, 1)}), flush=True)
    git(args.work, "update-ref", "refs/heads/main", head)
    started = time.monotonic()
    code, wall, err = watch_once(args.config, db)
    engine = create_engine(db)
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT workload, kind, state, change_pct, good_sha, bad_sha, culprit_sha, culprit_summary, opened_at, "
            "verified_at, updated_at FROM regression_history ORDER BY regression_id")).mappings().all()
        steps = conn.execute(text("SELECT count(*) FROM bisection_steps")).scalar()
    engine.dispose()
    print(json.dumps({"part": "regress", "injected": culprit[:10], "head": head[:10], "exit": code,
                      "pass_to_culprit_s": round(time.monotonic() - started, 1), "bisection_steps": steps,
                      "regressions": [{k: (str(v) if v is not None else None) for k, v in r.items()} for r in found],
                      "named_injected": any(r["culprit_sha"] == culprit for r in found),
                      **({"stderr": err} if code > 1 else {})}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tvm", type=Path, required=True, help="apache/tvm repository (a snapshot)")
    parser.add_argument("--work", type=Path, required=True, help="bare repository the watch's [repo] url names")
    parser.add_argument("--base", required=True, help="first commit of the window (built clean)")
    parser.add_argument("--commits", type=int, default=11, help="first-parent commits after --base")
    parser.add_argument("--config", required=True)
    parser.add_argument("--db", required=True, help="PostgreSQL URL; part 2 uses it with _regress appended")
    parser.add_argument("--inject-at", type=int, default=None, help="window index the regression follows")
    parser.add_argument("--skip-window", action="store_true")
    args = parser.parse_args()
    if not args.work.exists():
        subprocess.run(["git", "clone", "--quiet", "--bare", str(args.tvm), str(args.work)], check=True)
    base = git(args.work, "rev-parse", args.base)
    newest = subprocess.run(["git", "--git-dir", str(args.tvm), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    later = git(args.work, "rev-list", "--first-parent", "--reverse", f"{base}..{newest}")
    for url in (args.db, args.db + "_regress"):
        ensure_database(url)
    shas = [base, *later.split()[:args.commits]]
    if not args.skip_window:
        window(args, shas)
    if args.inject_at is not None:
        regression(args, shas)


if __name__ == "__main__":
    main()
