"""A crowd at the door: one burst of concurrent GETs at a real ``abwatch serve``, then normal requests.

    python -m benchmarks.crowd                          # 500 GETs from one client address
    python -m benchmarks.crowd --clients 50             # the same 500 from 50 addresses (10 each)
    python -m benchmarks.crowd --python OTHER/.venv/bin/python   # another abwatch's server

Fills a throw-away PostgreSQL database (on the server of ``--admin-url``, dropped at the end)
with a nightly history (:func:`benchmarks.store.fill`: ``--nights`` x 4 devices x
``--workloads``), starts ``abwatch serve`` on 127.0.0.1 with it, and sends ONE burst of
``--burst`` concurrent unauthenticated GETs with locust (headless, as a library): each of
``--burst`` users makes one request to one of the heavier read endpoints (runs list, a run's
report, regressions, a workload's series, the dashboard's overview and run pages) and stops.
``--clients N`` spreads the users over N loopback source addresses (127.0.1.x), so a per-client
rate limit sees N clients. Every request has a client timeout (``--timeout``).

A normal client (127.0.0.3) asks ``/api/runs`` once, 0.5 s into the burst.
Then, from a client address the burst did not use (127.0.0.2), it asks ``/api/runs`` until
the first 200 comes (each try bounded by ``--timeout``; all of it by ``--recover``), and times
a few normal requests to each endpoint. Prints status counts, latencies, and the time to the
first good answer after the burst. All traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

# locust patches the standard library for gevent when imported: it comes first
import locust  # noqa: I001
from locust import HttpUser, events, task
from locust.env import Environment
from locust.exception import StopUser

import argparse
import collections
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gevent
import requests
from requests.adapters import HTTPAdapter
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from abwatch.service.store import db
from benchmarks.store import fill

TOKEN = "crowd-bench-token"
PROBE_ADDRESS = "127.0.0.2"  # the normal client after the burst: an address the burst never used


class SourceAddress(HTTPAdapter):
    """A requests adapter whose connections leave from one loopback address (one "client")."""

    def __init__(self, address: str, **kwargs) -> None:
        self.address = address
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        """Bind every connection to ``self.address``."""
        kwargs["source_address"] = (self.address, 0)
        return super().init_poolmanager(*args, **kwargs)


def _config(work: Path, options: list[str]) -> Path:
    """A serve config like the tests' (``live_server``), plus ``[server]`` options KEY=VALUE (TOML values)."""
    path = work / "serve.toml"
    server = "\n".join(f"{key} = {value}" for key, _, value in (o.partition("=") for o in options))
    path.write_text(f"""
[repo]
url = {json.dumps(str(work))}
[build]
kind = "command"
command = ["true"]
[[workloads]]
name = "lcg-loop"
kind = "command"
command = ["true"]
[server]
{server}
""")
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(python: str, config: Path, url: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "ABWATCH_API_TOKEN": TOKEN}
    log = open(work / "server.log", "w")  # noqa: SIM115 - the server writes it until it stops
    process = subprocess.Popen([python, "-m", "abwatch.service.cli.main", "serve", "--config", str(config),
                                "--db", url, "--host", "127.0.0.1", "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(base + "/openapi.json", timeout=5).status_code == 200:
                return process, base
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"abwatch serve did not start:\n{(work / 'server.log').read_text()[-3000:]}")
        time.sleep(0.3)


def _targets(engine) -> dict[str, str]:
    """The heavier reads, each with an id or name the filled database holds."""
    with engine.connect() as connection:
        run_id = connection.execute(text("SELECT max(id) FROM runs")).scalar_one()
        old_run = connection.execute(text("SELECT min(id) FROM runs")).scalar_one()
    return {"runs list": "/api/runs?limit=100", "run report": f"/api/runs/{run_id}",
            "older run report": f"/api/runs/{old_run}", "regressions": "/api/regressions?limit=500",
            "series": "/api/workloads/resnet18/series", "series, one device": "/api/workloads/mlp/series?device=rasp4b-01",
            "overview page": "/", "run page": f"/runs/{run_id}"}


def burst(base: str, targets: dict[str, str], count: int, clients: int, timeout: float,
          limit_s: float) -> tuple[list, tuple]:
    """One burst: ``count`` locust users at once, one GET each; returns (name, status or error, ms)
    for each, and what a normal client (127.0.0.3) asking 0.5 s into the burst got."""
    results: list[tuple[str, str, float]] = []
    during: list[tuple] = []

    def normal_client() -> None:
        gevent.sleep(0.5)
        during.append(_get(base, targets["runs list"], timeout, address="127.0.0.3"))

    paths = itertools.cycle(targets.items())
    addresses = itertools.cycle([f"127.0.1.{10 + i}" for i in range(clients)])

    class Crowd(HttpUser):
        """One reader: one GET, then gone."""

        host = base

        def on_start(self) -> None:
            self.client.mount("http://", SourceAddress(next(addresses), pool_maxsize=1))
            self.target = next(paths)

        @task
        def read(self) -> None:
            name, path = self.target
            with self.client.get(path, name=name, timeout=timeout, catch_response=True) as response:
                if response.status_code:
                    response.success()  # every answer is counted by its status, below
            raise StopUser()

    def record(request_type, name, response_time, response_length, response=None, exception=None, **_):
        status = str(getattr(response, "status_code", 0) or "")
        if not status or status == "0":
            status = type(exception).__name__ if exception is not None else "no answer"
        results.append((name, status, response_time))

    environment = Environment(user_classes=[Crowd], events=events)
    environment.events.request.add_listener(record)
    runner = environment.create_local_runner()
    runner.start(count, spawn_rate=count * 10)
    probe = gevent.spawn(normal_client)
    deadline = time.monotonic() + limit_s
    while len(results) < count and time.monotonic() < deadline:
        gevent.sleep(0.1)
    runner.quit()
    environment.events.request.remove_listener(record)
    probe.join(timeout=max(1.0, deadline - time.monotonic()))
    return results, (during[0] if during else ("no answer", 0.0, None))


def _get(base: str, path: str, timeout: float, address: str = PROBE_ADDRESS,
         headers: dict | None = None) -> tuple[str, float, requests.structures.CaseInsensitiveDict]:
    with requests.Session() as session:
        session.mount("http://", SourceAddress(address))
        t0 = time.perf_counter()
        try:
            response = session.get(base + path, timeout=timeout, headers=headers or {})
            status, got = str(response.status_code), response.headers
        except requests.RequestException as exc:
            status, got = type(exc).__name__, requests.structures.CaseInsensitiveDict()
    return status, (time.perf_counter() - t0) * 1000, got


def _percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return f"median {statistics.median(values):.0f} ms, p90 {pick(0.9):.0f} ms, max {values[-1]:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    """Fill, serve, burst, probe, print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admin-url", default=os.environ.get(
        "ABWATCH_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose abwatch serves")
    parser.add_argument("--nights", type=int, default=60)
    parser.add_argument("--workloads", type=int, default=12)
    parser.add_argument("--burst", type=int, default=500, help="concurrent GETs in the one burst")
    parser.add_argument("--clients", type=int, default=1, help="loopback addresses the burst comes from")
    parser.add_argument("--timeout", type=float, default=120.0, help="client timeout of each request (s)")
    parser.add_argument("--recover", type=float, default=600.0,
                        help="how long to wait, after the burst, for the first good answer (s)")
    parser.add_argument("--server", action="append", default=[], metavar="KEY=VALUE",
                        help="a [server] option of the serve config (TOML value), e.g. max_in_flight=8")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 200:
        parser.error("--clients: 1 to 200")
    if any("=" not in option for option in args.server):
        parser.error("--server: KEY=VALUE, the value in TOML (a string in quotes)")
    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    name = f"abwatch_crowd_bench_{os.getpid()}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.admin_url).set(database=name).render_as_string(hide_password=False)
    process = None
    try:
        db.upgrade(url)
        engine = db.make_engine(url)
        with Session(engine) as session:
            counts = fill(session, args.nights, args.workloads, random.Random(1))
        targets = _targets(engine)
        engine.dispose()
        work = Path(tempfile.mkdtemp(prefix="abwatch-crowd-"))
        process, base = _start_server(args.python, _config(work, args.server), url, work)
        load = os.getloadavg()[0]
        print(f"database: {counts['runs']} runs, {counts['regressions']} regressions, {counts['samples']:,} samples; "
              f"server options: {' '.join(args.server) or '(defaults)'}; load average {load:.1f} on "
              f"{os.cpu_count()} CPUs", flush=True)
        before = {label: _get(base, path, args.timeout) for label, path in targets.items()}
        print("before the burst, one request each: " + ", ".join(
            f"{label} {status} {ms:.0f} ms" for label, (status, ms, _) in before.items()), flush=True)

        t0 = time.monotonic()
        results, during = burst(base, targets, args.burst, args.clients, args.timeout, args.timeout + 60)
        burst_s = time.monotonic() - t0
        ended = time.monotonic()
        by_status = collections.Counter(status for _, status, _ in results)
        print(f"\nburst: {len(results)} of {args.burst} answered or failed in {burst_s:.1f} s from "
              f"{args.clients} client address(es); status counts: {dict(sorted(by_status.items()))}")
        print(f"  a normal client during the burst (0.5 s in, 127.0.0.3): {during[0]} in {during[1]:.0f} ms")
        for status in sorted(by_status):
            print(f"  {status}: {_percentiles([ms for _, s, ms in results if s == status])}")
        per_target = collections.defaultdict(collections.Counter)
        for label, status, _ in results:
            per_target[label][status] += 1
        for label in targets:
            print(f"  {label}: {dict(sorted(per_target[label].items()))}")

        tries = []
        while time.monotonic() - ended < args.recover:
            status, ms, _ = _get(base, targets["runs list"], args.timeout)
            tries.append((status, ms))
            if status == "200":
                break
            time.sleep(0.2)
        first = time.monotonic() - ended
        good = bool(tries) and tries[-1][0] == "200"
        print(f"\nafter the burst, from another client ({PROBE_ADDRESS}): first 200 "
              f"{'after' if good else 'NOT within'} {first:.2f} s ({len(tries)} tries: "
              f"{', '.join(f'{s} {ms:.0f} ms' for s, ms in tries[:5])}{' ...' if len(tries) > 5 else ''})")
        print("normal requests after it: " + ", ".join(
            f"{label} {status} {ms:.0f} ms" for label, (status, ms, _) in
            ((label, _get(base, path, args.timeout)) for label, path in targets.items())))
        status, ms, headers = _get(base, targets["runs list"], args.timeout, address="127.0.1.10")
        print(f"the burst's own client again: {status} in {ms:.0f} ms"
              + (f" (Retry-After {headers['retry-after']})" if "retry-after" in headers else ""))
        status, ms, _ = _get(base, targets["runs list"], args.timeout, address="127.0.1.10",
                             headers={"Authorization": f"Bearer {TOKEN}"})
        print(f"the burst's own client with the write token: {status} in {ms:.0f} ms")
        print(f"(locust {locust.__version__}; load average now {os.getloadavg()[0]:.1f}; "
              f"server log: {work / 'server.log'})")
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    sys.exit(main())
