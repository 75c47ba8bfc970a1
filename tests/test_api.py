"""The REST API, served by a real `abwatch serve` process on a database of real runs."""

from __future__ import annotations

import pytest
import json
import os
import socket
import re
import subprocess
import sys
from pathlib import Path

import requests
from sqlalchemy import text

from abwatch.service.store import db
from conftest import live_server

DATA = Path(__file__).resolve().parent / "data"


def get(base: str, path: str, **params):
    response = requests.get(base + path, params=params, timeout=30)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.json()


def test_runs_and_one_runs_full_report(filled_server):
    base, runs, _ = filled_server
    listed = get(base, "/api/runs")
    assert [r["id"] for r in listed] == sorted(runs.values(), reverse=True)
    assert next(r for r in listed if r["id"] == runs["regression"])["verdicts"] == {"regression": 1}
    report = get(base, f"/api/runs/{runs['regression']}")
    assert report["treatment_ref"] == "slower" and report["status"] == "completed"
    (result,) = report["results"]
    assert result["workload"] == "lcg-loop" and result["verdict"] == "regression"
    low, high = result["ci_pct"]
    assert 0 < low <= result["change_pct"] <= high
    assert result["regression_id"] == report["regressions"][0]["id"]
    medians = report["process_medians_ms"]["lcg-loop"]
    assert len(medians["control"]) == result["control"]["n"] // 5  # five samples a process
    # each process's median, as many a side as it measured (which side is slower is the verdict's
    # to say: beside six busy loops even the least disturbed control process was pre-empted)
    assert len(medians["treatment"]) == len(medians["control"]) and all(
        m > 0 for side in medians.values() for m in side)
    assert {b["side"]: b["ref"] for b in report["builds"]} == {"control": "noop", "treatment": "slower"}
    missing = requests.get(f"{base}/api/runs/999999", timeout=10)
    assert missing.status_code == 404 and "run 999999 does not exist" in missing.json()["detail"]


def test_regressions_with_filters(filled_server):
    base, runs, _ = filled_server
    (regression,) = get(base, "/api/regressions")
    assert regression["state"] == "regress" and regression["run_id"] == runs["regression"]
    device = regression["device"]
    assert get(base, "/api/regressions", state="regress", workload="lcg-loop", device=device) == [regression]
    assert get(base, "/api/regressions", state="cleared") == []
    assert get(base, "/api/regressions", workload="other") == []
    assert get(base, "/api/regressions", device="no-such-board") == []
    assert get(base, "/api/regressions", since="2000-01-01T00:00:00Z") == [regression]
    assert get(base, "/api/regressions", since="2999-01-01T00:00:00Z") == []
    bad = requests.get(f"{base}/api/regressions", params={"state": "bogus"}, timeout=10)
    assert bad.status_code == 422
    detail = get(base, f"/api/regressions/{regression['id']}")
    assert [e["to"] for e in detail["events"]] == ["benchmark", "verify", "regress"]
    # a compare and its verify name a range; only bisection names a culprit (none ran here)
    assert detail["culprit"] is None and detail["bisection"] == []
    assert detail["range"] == {"good": regression["control_sha"], "bad": regression["treatment_sha"]}
    # a command's run-time regression on time: no per-operator table and no profile, and it says so
    assert detail["explanation"]["what"] is None and "per-operator" in detail["explanation"]["reason"]


def test_series_with_change_points_records_and_watch(filled_server):
    base, runs, _ = filled_server
    (workload,) = get(base, "/api/workloads")
    assert workload["name"] == "lcg-loop" and len(workload["devices"]) == 1
    series = get(base, "/api/workloads/lcg-loop/series")
    (device,) = series["devices"]
    assert [p["summary"] for p in device["points"]] == [
        "Baseline", "Reword the README only", "Do 20% more work", "Do 20% less work"]
    assert "change_points" in device and device["regressions"][0]["run_id"] == runs["regression"]
    records = get(base, "/api/records", run=runs["regression"])
    assert len(records) == 2 and {r["schema_version"] for r in records} == {"0.1"}
    assert {r["metadata"]["side"] for r in records} == {"control", "treatment"}
    watch = get(base, "/api/watch")
    # compares only: nothing is watched, the repository was compared
    assert watch["watched"] == [] and watch["compared"][0]["run_id"] == runs["faster"]
    assert watch["open_regressions"] == 1
    schema = get(base, "/openapi.json")
    assert {"/api/runs", "/api/runs/{run_id}", "/api/regressions", "/api/records",
            "/api/workloads/{workload}/series", "/api/watch"} <= set(schema["paths"])


def _record(workload: str, mean: float = 1.5) -> dict:
    return {"workload": workload, "engine": "tvm", "hardware": "remote-board", "runtime_ms_mean": mean,
            "runtime_ms_std": 0.1, "timestamp": 1700000000.0, "schema_version": "0.1",
            "metrics": {"compilation_ms": 1234.0}}


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_post_records_needs_the_token_limits_size_and_is_all_or_nothing(fresh_pg_url, tmp_path):
    engine = db.make_engine(fresh_pg_url)
    db.ensure_schema(engine)

    def stored() -> int:
        with engine.connect() as connection:
            return connection.execute(text("SELECT count(*) FROM records")).scalar_one()

    with live_server(fresh_pg_url, tmp_path / "srv", max_body_mb=0.05) as base:
        url = base + "/api/records"
        good = [_record("remote-a"), _record("remote-b")]
        assert requests.post(url, json=good, timeout=10).status_code == 401
        wrong = requests.post(url, json=good, headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        auth = {"Authorization": "Bearer s3cret-token"}
        bad = good + [{**_record("remote-c"), "runtime_ms_mean": "fast"}]
        refused = requests.post(url, json=bad, headers=auth, timeout=10)
        assert refused.status_code == 422
        assert "record 3: runtime_ms_mean" in refused.json()["detail"]
        assert stored() == 0
        big = [_record(f"w{i}") for i in range(400)]
        assert len(json.dumps(big)) > 0.05 * 2**20
        assert requests.post(url, json=big, headers=auth, timeout=10).status_code == 413
        assert requests.post(url, data=b"{not json", headers=auth, timeout=10).status_code == 400
        assert stored() == 0
        accepted = requests.post(url, json=good, headers=auth, timeout=10)
        assert accepted.status_code == 201 and accepted.json()["imported"] == 2
        one = requests.post(url, json=_record("remote-d"), headers=auth, timeout=10)
        assert one.status_code == 201 and one.json()["imported"] == 1
        assert stored() == 3
        again = requests.post(url, json=good, headers=auth, timeout=10)  # idempotent by record key
        assert again.status_code == 201 and again.json()["imported"] == 0 and stored() == 3
        back = requests.get(url, params={"workload": "remote-a"}, timeout=10).json()
        assert back == [good[0]]
    engine.dispose()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_writes_are_refused_when_no_token_is_configured(fresh_pg_url, tmp_path):
    with live_server(fresh_pg_url, tmp_path / "srv", token=None) as base:
        response = requests.post(base + "/api/records", json=_record("x"),
                                 headers={"Authorization": "Bearer "}, timeout=10)
        assert response.status_code == 401 and "ABWATCH_API_TOKEN is not set" in response.json()["detail"]


def _fuzz(base: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Schemathesis's CLI on every operation of the schema, with NUL allowed in generated strings
    and path parameters also drawn with NUL and at 6000 characters (tests/fuzz_hooks.py)."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", base + "/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "25", "--seed", "1", "--workers", "1", "--request-timeout", "30", "--no-shrink",
         "--generation-allow-x00", "true", "--report", "junit,har", "--report-dir", str(tmp_path), *extra],
        capture_output=True, text=True, timeout=900, env=env)


def _assert_clean(result: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts and counts[1] == counts[2] and int(counts[1]) >= 100, result.stdout[-3000:]
    # what was sent (the HAR report): the schema's methods and others (405, or 401 for a write
    # without the token), and NUL in path parameters
    (har,) = tmp_path.glob("har-*.json")
    sent = [(e["request"]["method"], e["request"]["url"]) for e in json.loads(har.read_text())["log"]["entries"]]
    assert {method for method, _ in sent} >= {"GET", "POST", "PUT", "PATCH", "DELETE"}
    for route in (r"/api/workloads/[^/]*%00[^/]*/series", r"/api/runs/[^/]*%00"):
        assert any(re.search(route, url) for _, url in sent), route


def test_fuzzing_the_read_api_finds_no_server_errors(filled_server, tmp_path):
    """Schemathesis against the live app on real runs (no token: writes answer 401)."""
    base, _, _ = filled_server
    result = _fuzz(base, tmp_path)
    _assert_clean(result, tmp_path)


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_fuzzing_with_the_token_finds_no_server_errors(fresh_pg_url, tmp_path):
    """Schemathesis with the write token, on a database of its own (it may store records)."""
    with live_server(fresh_pg_url, tmp_path / "srv") as base:
        result = _fuzz(base, tmp_path, "--header", "Authorization: Bearer s3cret-token")
    _assert_clean(result, tmp_path)


def _raw(base: str, head: str, body: bytes) -> bytes:
    """Send a request's head and the first part of its body on a raw socket; the answer that
    comes back (the server may answer before the body it was promised has arrived)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


def test_writes_check_the_token_and_size_before_reading_a_body(filled_server):
    base, runs, token = filled_server
    path = "/api/regressions/1/triage"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 400000000")
    # 400 MB promised, 64 KB sent: the answer comes at once, the body unread
    assert _raw(base, head, b"{" + b" " * 65536).startswith(b"HTTP/1.1 401")
    assert _raw(base, head + f"\r\nAuthorization: Bearer {token}", b"{").startswith(b"HTTP/1.1 413")
    # no declared length (chunked): cut as soon as the bytes read pass the limit (1 MB here)
    chunked = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked")
    piece = b" " * 65536
    stream = b"".join(b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(20))
    assert _raw(base, chunked, stream).startswith(b"HTTP/1.1 413")
    for method in ("put", "patch", "delete"):  # every write method, routed or not: the token first
        assert requests.request(method, base + path, data=b"x" * 1000, timeout=10).status_code == 401


def test_invalid_bodies_get_a_small_422_that_never_echoes_them(filled_server):
    base, _, token = filled_server
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    url = base + "/api/regressions/1/triage"
    huge = json.dumps({"as": "expected", "who": "w" * 500_000})
    answer = requests.post(url, data=huge, headers=auth, timeout=30)
    assert answer.status_code == 422 and len(answer.content) < 2000 and "wwwwwwww" not in answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "who"]
    nan = requests.post(url, data='{"a": NaN}', headers=auth, timeout=10)  # once a 500
    assert nan.status_code == 422 and "NaN" not in nan.text
    broken = requests.post(url, data="{not json", headers=auth, timeout=10)
    assert broken.status_code == 422 and "not json" not in broken.text
    # a fixing commit goes with `fixed`, and is hex
    before = get(base, "/api/regressions/1")["triage_events"]
    for body in ({"as": "wontfix", "who": "ana", "fixed_by": "abc1234"},
                 {"as": "fixed", "who": "ana", "fixed_by": "$(reboot)"}):
        refused = requests.post(url, json=body, headers=auth, timeout=10)
        assert refused.status_code == 422 and "reboot" not in refused.text, body
    assert get(base, "/api/regressions/1")["triage_events"] == before  # nothing was recorded


def test_nul_in_a_path_or_query_is_a_client_error_everywhere(filled_server):
    base, _, _ = filled_server
    for path in ("/workloads/%00", "/workloads/a%00b", "/api/workloads/%00/series", "/runs/%00",
                 "/api/regressions/%00", "/regressions/%00"):
        assert requests.get(base + path, timeout=10).status_code == 404, path
    for path in ("/api/regressions?workload=%00", "/api/records?workload=a%00", "/workloads/x?device=%00"):
        assert requests.get(base + path, timeout=10).status_code == 422, path


def test_the_trend_plots_the_verdicts_scale(filled_server, filled_pg_url):
    base, _, _ = filled_server
    series = get(base, "/api/workloads/lcg-loop/series")
    assert "fastest sample" in series["estimator"]
    points = series["devices"][0]["points"]
    # each commit's figure is its processes' fastest samples' median: never above the plain median
    assert all(p["fastest_ms"] is not None and p["ms"] == p["fastest_ms"] <= p["median_ms"] for p in points)
    values = {p["summary"]: p["ms"] for p in points}
    assert {"Baseline", "Do 20% more work", "Do 20% less work"} <= set(values)
    # The wall-time scale shows the ±20 % steps only where the runs were not heavily contended:
    # on an oversubscribed host the scheduler's time slices move wall times more than that
    # (the verdicts were then judged on CPU time, which tests/test_compare.py checks).
    engine = db.make_engine(filled_pg_url[0])
    with engine.connect() as connection:
        contended = connection.execute(text(
            "SELECT count(*) FROM comparisons WHERE (details -> 'contention' ->> 'heavy')::boolean")).scalar()
    engine.dispose()
    if not contended:
        assert values["Do 20% more work"] > values["Baseline"] * 1.1 > values["Do 20% less work"]
