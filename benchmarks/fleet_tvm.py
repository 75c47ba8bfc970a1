"""A fleet against one host, on real apache/tvm history built from source with LLVM.

A window of first-parent commits (``--commits``, ending at ``--head``) is watched on two CPU
devices (``cpu-a``, ``cpu-b``) twice, each time from a fresh PostgreSQL database:

``single``
    one host does everything: two ``abwatch worker --device`` processes sharing one
    ``cache_dir`` (one builds a commit, the other waits for it), no store, a local ccache;
``fleet``
    one build host (``abwatch worker --builds``, ccache in front of Redis) and two device hosts
    (``worker --device``, a ``cache_dir`` each), meeting through PostgreSQL and an nginx
    WebDAV store (the test's server, ``tests/webdav.py``).

Both start from the same state: the commit before the window (the first control) was built
once beforehand (``prime``), by a clean build that wrote the single host's ccache and Redis,
and the build host built it again from Redis; so the timed part is the window's incremental
builds, the store's traffic and the measurements. ``second`` builds one commit of the window
(a header-touching one) on another build host, a fresh ``cache_dir`` in front of the same
Redis: how much of it is compiled again. ``fetch`` has the build host push the base and the
next ``--fetches`` commits and a device host with an empty cache fetch each after the other:
what each fetch downloads. ``report`` prints docs/fleet.md's tables.

    python -m benchmarks.fleet_tvm --work /srv/bench-fleet prime
    python -m benchmarks.fleet_tvm --work /srv/bench-fleet single
    python -m benchmarks.fleet_tvm --work /srv/bench-fleet fleet
    python -m benchmarks.fleet_tvm --work /srv/bench-fleet second --commit cdef3efe41
    python -m benchmarks.fleet_tvm --work /srv/bench-fleet fetch --fetches 3
    python -m benchmarks.fleet_tvm --work /srv/bench-fleet report

``--work`` holds ``build.toml`` (the ``[build]`` section every host shares: a ``tvm-source``
build with LLVM and the mirrors). Each phase appends one JSON line to ``results.jsonl``.
Nothing here runs in CI: it needs a TVM mirror and an hour of compiling.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import os
import secrets
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from abwatch.builders import TvmSourceBuilder, make_builder
from abwatch.builders.cache import ArtifactCache
from abwatch.service.compare.building import build_commits
from abwatch.service.config import load_config
from abwatch.service.store.models import Build, Comparison, Device, Job, Run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from webdav import WebDav  # noqa: E402  (the tests' nginx: the server block docs/fleet.md deploys)

DEVICES = ("cpu-a", "cpu-b")
BUILDS = "@builds"


def host_toml(args: argparse.Namespace, cache_dir: Path, *, base: str, store: str | None = None,
              remote: bool = False) -> str:
    """One host's config: the shared [build], its own cache_dir, the window's watch."""
    build = (args.work / "build.toml").read_text()
    if remote:
        build = build.replace("[build]\n", f"[build]\nccache_remote = {json.dumps(args.redis)}\n", 1)
    return f"""cache_dir = {json.dumps(str(cache_dir))}
[repo]
url = {json.dumps(str(args.work / "tvm.git"))}
branch = "window"
{build}
[[workloads]]
name = "matmul"
kind = "tvm"
model = "te:matmul"
options = {{m = 128, k = 128, n = 128}}
[run]
repetitions = 8
max_repetitions = 8
compile_repetitions = 0
noise_aware = false
[runner]
kind = "cpu"
threads = 1
[stats]
threshold_pct = 25.0
[watch]
start = {json.dumps(base)}
control = "previous"
verify = false
bisect = false
devices = {json.dumps(list(DEVICES))}
heartbeat_s = 10
""" + (f"[artifacts]\nstore = {json.dumps(store)}\nwait_s = 7200\n" if store else "")


def window(args: argparse.Namespace) -> list[str]:
    """The base (first control) and the window's commits, oldest first; makes the watched repository."""
    repo = args.work / "tvm.git"
    if not repo.exists():  # a bare clone sharing the mirror's objects, its branch at the window's head
        subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(args.repo), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "branch", "--force", "window", args.head], check=True)
    out = subprocess.run(["git", "-C", str(repo), "rev-list", "--first-parent", f"--max-count={args.commits + 1}",
                          "window"], check=True, capture_output=True, text=True).stdout.split()
    return out[::-1]


def record(args: argparse.Namespace, entry: dict) -> None:
    """One result line, printed and appended to results.jsonl."""
    print(json.dumps(entry), flush=True)
    with (args.work / "results.jsonl").open("a") as out:
        out.write(json.dumps(entry) + "\n")


def builder_of(args: argparse.Namespace, cache_dir: Path, base: str, *, remote: bool) -> TvmSourceBuilder:
    path = cache_dir.with_suffix(".toml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(host_toml(args, cache_dir, base=base, remote=remote))
    return TvmSourceBuilder(load_config(path))


def build_once(args: argparse.Namespace, phase: str, cache_dir: Path, sha: str, base: str, *, remote: bool) -> None:
    """Build ``sha`` on the host of ``cache_dir`` (no database): its time and compiler cache counts."""
    builder = builder_of(args, cache_dir, base, remote=remote)
    started = time.monotonic()
    artifact = builder.build(sha)
    if artifact.cached:  # built by an earlier run of this phase: its line is in results.jsonl already
        print(f"{phase}: {sha[:10]} is in {cache_dir}'s cache already", flush=True)
        return
    m = artifact.metrics
    record(args, {"phase": phase, "host": cache_dir.name, "sha": sha[:10], "cached": artifact.cached,
                  "wall_s": round(time.monotonic() - started, 1), "compile_s": m.get("compile_s"),
                  "compile_cpu_s": m.get("compile_cpu_s"), "steps": m.get("steps"),
                  **{k: v for k, v in m.items() if k.startswith("ccache_")}})


def fresh_database(args: argparse.Namespace, name: str) -> str:
    """An empty database ``name`` on the server, migrated to head; its URL."""
    admin = create_engine(f"{args.server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = f"{args.server}/{name}"
    abwatch("db", "upgrade", "--db", url)
    return url


def abwatch(*argv: str, log: Path | None = None) -> subprocess.CompletedProcess:
    """The abwatch CLI as a process of its own (a host's command)."""
    command = [sys.executable, "-m", "abwatch.service.cli.main", *argv]
    if log is None:
        return subprocess.run(command, check=True)
    with log.open("a") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)


def start(config: Path, url: str, log: Path, *args: str) -> subprocess.Popen:
    """``abwatch worker`` as a process of its own."""
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "worker", "--config", str(config),
                                 "--db", url, *args], stdout=out, stderr=subprocess.STDOUT)


def run_watch(args: argparse.Namespace, phase: str, url: str, hosts: dict[str, tuple[Path, list[str]]]) -> None:
    """Queue the window (``watch --once --no-work``), start the hosts' workers, wait until every
    job ended, stop them; record builds, compile CPU, verdicts and wall times."""
    first = next(iter(hosts.values()))[0]
    abwatch("watch", "--config", str(first), "--once", "--no-work", "--db", url)
    engine = create_engine(url)
    started = time.time()
    procs = {name: start(config, url, args.work / phase / f"{name}.log", *worker_args)
             for name, (config, worker_args) in hosts.items()}
    try:
        while True:
            with Session(engine) as session:
                states = session.execute(select(Job.status)).scalars().all()
            if states and all(s.value in ("done", "failed") for s in states):
                break
            dead = [name for name, proc in procs.items() if proc.poll() is not None]
            if dead:
                raise SystemExit(f"{phase}: worker(s) {dead} exited; see {args.work / phase}/*.log")
            time.sleep(2)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=120)
    record(args, {"phase": phase, **summary(engine, started), "hosts_compiling": compiling_hosts(args, phase, hosts)})
    engine.dispose()


def summary(engine, started: float) -> dict:
    """What the database says of one timed phase."""
    with Session(engine) as session:
        builds = session.scalars(select(Build).order_by(Build.id)).all()
        shas = {b.id: b.commit.sha for b in builds}
        jobs = session.scalars(select(Job)).all()
        verdicts = session.execute(select(Device.name, Comparison.verdict).join(Run, Run.id == Comparison.run_id)
                                   .join(Device, Device.id == Run.device_id)).all()
    fresh = [b for b in builds if not b.cached and b.metrics]
    done = {d: max((j.finished_at.timestamp() for j in jobs if j.device == d and j.finished_at), default=None)
            for d in (*DEVICES, BUILDS)}
    return {
        "builds": len(builds), "compiled": len(fresh), "failed": sum(b.status.value != "success" for b in builds),
        "compile_cpu_s": round(sum(b.metrics.get("compile_cpu_s") or 0 for b in fresh), 1),
        "compile_wall_s": round(sum(b.metrics.get("compile_s") or 0 for b in fresh), 1),
        "build_wall_s": round(sum(b.duration_s or 0 for b in fresh), 1),
        "ccache_misses": sum(b.metrics.get("ccache_misses") or 0 for b in fresh),
        "ccache_hits": sum(b.metrics.get("ccache_hits") or 0 for b in fresh),
        "jobs": {s: sum(j.status.value == s for j in jobs) for s in ("done", "failed")},
        "verdicts": {d: sum(name == d for name, _ in verdicts) for d in DEVICES},
        "wall_to_verdicts_s": {d: round(t - started, 1) if t else None for d, t in done.items()},
        "each": [{"sha": shas[b.id][:10], "cached": b.cached, "status": b.status.value, "wall_s": b.duration_s,
                  **{k: (b.metrics or {}).get(k) for k in ("compile_s", "compile_cpu_s", "steps", "ccache_misses",
                                                           "ccache_local_hits", "ccache_remote_hits")}}
                 for b in builds],
    }


def compiling_hosts(args: argparse.Namespace, phase: str, hosts: dict[str, tuple[Path, list[str]]]) -> list[str]:
    """Hosts whose cache_dir holds a tvm-source workspace: those that compiled TVM."""
    dirs = {name: Path(tomllib.loads(config.read_text())["cache_dir"]) for name, (config, _) in hosts.items()}
    return sorted(name for name, d in dirs.items() if (d / "tvm-source").is_dir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["prime", "single", "fleet", "second", "fetch", "report"])
    parser.add_argument("--work", type=Path, default=Path("/srv/bench-fleet"))
    parser.add_argument("--repo", type=Path, default=Path("/srv/mirrors/apache/tvm"))
    parser.add_argument("--head", default="50c9ca7ee1", help="the window's newest commit")
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5", help="the shared compiler cache")
    parser.add_argument("--server", default="postgresql+psycopg2://postgres@127.0.0.1")
    parser.add_argument("--commit", help="second: the commit to build on the second build host")
    parser.add_argument("--fetches", type=int, default=3, help="fetch: the window's commits fetched after the base")
    args = parser.parse_args()
    args.work = args.work.resolve()
    # every host of the fleet signs and checks manifests with one key ([artifacts] manifest_key_env)
    os.environ.setdefault("ABWATCH_MANIFEST_KEY", secrets.token_hex(32))
    commits = window(args)
    base = commits[0]
    if args.phase == "prime":
        build_once(args, "prime", args.work / "single", base, base, remote=True)  # clean: writes Redis too
        build_once(args, "prime", args.work / "fleet" / "builder", base, base, remote=True)  # from Redis
    elif args.phase == "second":
        sha = next(c for c in commits if c.startswith(args.commit))
        build_once(args, "second", args.work / "second", sha, base, remote=True)
    elif args.phase == "fetch":
        fetches(args, commits, base)
    elif args.phase == "single":
        (args.work / "single-run").mkdir(exist_ok=True)
        config = args.work / "single-host.toml"
        config.write_text(host_toml(args, args.work / "single", base=base))
        url = fresh_database(args, "abwatch_bench_single")
        run_watch(args, "single-run", url, {d: (config, ["--device", d]) for d in DEVICES})
    elif args.phase == "fleet":
        (args.work / "fleet-run").mkdir(exist_ok=True)
        store = WebDav(args.work / "fleet" / "store").start()
        try:
            configs = {}
            for name, remote in (("builder", True), ("dev-a", False), ("dev-b", False)):
                configs[name] = args.work / "fleet" / f"{name}-host.toml"
                configs[name].write_text(host_toml(args, args.work / "fleet" / name, base=base, store=store.url,
                                                   remote=remote))
            url = fresh_database(args, "abwatch_bench_fleet")
            run_watch(args, "fleet-run", url, {"builder": (configs["builder"], ["--builds"]),
                                               "dev-a": (configs["dev-a"], ["--device", DEVICES[0]]),
                                               "dev-b": (configs["dev-b"], ["--device", DEVICES[1]])})
            record(args, {"phase": "store", "objects": len(store.objects()), "puts": store.requests("PUT"),
                          "gets": store.requests("GET"),
                          "bytes": sum(p.stat().st_size for p in store.objects())})
        finally:
            store.stop()
    else:
        report(args)


class Said:
    """Progress that prints each line and keeps it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def invocation(self, workload: str, done: int, total: int) -> None:
        pass


def fetches(args: argparse.Namespace, commits: list[str], base: str) -> None:
    """The build host (``fleet/builder``) builds and pushes the base and the next ``--fetches``
    commits, one at a time; after each, a device host with an empty cache (``fetch/device``)
    fetches it: the objects and bytes it downloads, the objects it had, the GETs, the seconds."""
    device_dir = args.work / "fetch" / "device"
    shutil.rmtree(device_dir, ignore_errors=True)
    store = WebDav(args.work / "fetch" / "store").start()
    try:
        configs = {}
        for name, cache_dir, remote in (("builder", args.work / "fleet" / "builder", True),
                                        ("device", device_dir, False)):
            configs[name] = args.work / "fetch" / f"{name}-host.toml"
            configs[name].write_text(host_toml(args, cache_dir, base=base, store=store.url, remote=remote))
        engine = create_engine(fresh_database(args, "abwatch_bench_fetch"))
        for sha in commits[:args.fetches + 1]:
            for name in ("builder", "device"):
                said, gets, started = Said(), store.requests("GET"), time.monotonic()
                with Session(engine, expire_on_commit=False) as session:
                    [outcome] = build_commits(session, make_builder(load_config(configs[name])), [sha], said)
                if name == "device":
                    line = next((t.strip() for t in said.lines if "fetched" in t), None)
                    record(args, {"phase": "fetch", "host": sha[:10], "sha": sha[:10], "status": outcome.status,
                                  "wall_s": round(time.monotonic() - started, 1),
                                  "gets": store.requests("GET") - gets, "said": line,
                                  "device_cache_bytes": ArtifactCache(device_dir / "artifacts").size_bytes()})
    finally:
        store.stop()


def report(args: argparse.Namespace) -> None:
    """docs/fleet.md's tables, from the newest line of each phase in results.jsonl."""
    newest: dict[tuple[str, str], dict] = {}
    for line in (args.work / "results.jsonl").read_text().splitlines():
        entry = json.loads(line)
        newest[(entry["phase"], entry.get("host", ""))] = entry
    single, fleet = newest.get(("single-run", ""), {}), newest.get(("fleet-run", ""), {})

    def cell(entry: dict, *path: str) -> str:
        value: object = entry
        for name in path:
            value = value.get(name) if isinstance(value, dict) else None
        return "-" if value is None else f"{value:,.1f}" if isinstance(value, float) else str(value)

    rows = [("build rows (compiled here)", lambda e: f"{cell(e, 'builds')} ({cell(e, 'compiled')})"),
             ("compile CPU-seconds", lambda e: cell(e, "compile_cpu_s")),
             ("compile wall seconds", lambda e: cell(e, "compile_wall_s")),
             ("build wall seconds (checkout to stored artifact)", lambda e: cell(e, "build_wall_s")),
             ("ccache hits / misses", lambda e: f"{cell(e, 'ccache_hits')} / {cell(e, 'ccache_misses')}"),
             ("hosts that compiled TVM", lambda e: ", ".join(e.get("hosts_compiling", [])) or "none"),
             ("verdicts cpu-a / cpu-b", lambda e: f"{cell(e, 'verdicts', DEVICES[0])} / {cell(e, 'verdicts', DEVICES[1])}"),
             ("wall time to cpu-a's last verdict, s", lambda e: cell(e, "wall_to_verdicts_s", DEVICES[0])),
             ("wall time to cpu-b's last verdict, s", lambda e: cell(e, "wall_to_verdicts_s", DEVICES[1])),
             ("wall time to both devices' verdicts, s",
              lambda e: cell({"t": max((v for k, v in e.get("wall_to_verdicts_s", {}).items() if k in DEVICES and v),
                                       default=None)}, "t"))]
    print("| | one host, both devices | build host + two device hosts |\n| --- | --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value(single)} | {value(fleet)} |")
    print("\n| build (no database) | host | commit | wall s | compile CPU-s | local hits | remote hits | misses |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (phase, host), e in newest.items():
        if phase in ("prime", "second"):
            print(f"| {phase} | {host} | {e['sha']} | {cell(e, 'wall_s')} | {cell(e, 'compile_cpu_s')} | "
                  f"{cell(e, 'ccache_local_hits')} | {cell(e, 'ccache_remote_hits')} | {cell(e, 'ccache_misses')} |")
    fetched = [e for (phase, _), e in newest.items() if phase == "fetch"]
    if fetched:
        print("\n| fetched on a fresh device host | GETs | wall s | what it said | device host's cache |")
        print("| --- | --- | --- | --- | --- |")
        for e in fetched:
            print(f"| {e['sha']} | {e['gets']} | {cell(e, 'wall_s')} | {e['said']} | "
                  f"{e['device_cache_bytes'] / 2**20:,.1f} MiB |")
    if ("store", "") in newest:
        e = newest[("store", "")]
        print(f"\nstore: {e['objects']} objects, {e['bytes'] / 2**20:,.1f} MiB; {e['puts']} PUT, {e['gets']} GET")


if __name__ == "__main__":
    main()
