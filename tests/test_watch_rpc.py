"""RPC boards are watch devices: a real TVM RPC tracker and server on 127.0.0.1 (key
``local-cpu``), a real git history whose builds are a released apache-tvm (:mod:`tests.tvm_repo`),
real ``abwatch worker`` processes on real PostgreSQL. The watch queues the board's jobs under
its tracker key; the worker for that key takes them and measures through the tracker; a worker
for another device, running all along, never takes one.
"""

from __future__ import annotations

import pytest
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.store.models import Device, Record, Run, RunStatus, WatchedCommit

from tests import tvm_repo
from tests.test_watch_workers import all_done, jobs, start_worker, stop, wait_for

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

MATMUL = '[[workloads]]\nname = "matmul"\nkind = "tvm"\nmodel = "te:matmul"\noptions = {m = 64, k = 64, n = 64}\n'
RUN = "repetitions = 2\nmax_repetitions = 2\nwarmup = 0\ncompile_repetitions = 0\ntimeout_s = 120"


def test_a_board_is_a_device_its_jobs_go_to_the_worker_of_its_tracker_key(tmp_path, tvm_python, rpc_board,
                                                                          fresh_pg_url, capsys):
    tracker, board = rpc_board
    repo = tmp_path / "repo"
    base = tvm_repo.commit(repo, "base", "Baseline")
    config = tmp_path / "watch.toml"
    config.write_text(tvm_repo.config_text(
        tmp_path, repo, tvm_python, workloads=MATMUL, run=RUN,
        runner=f'kind = "rpc"\ntracker = "{tracker}"\nkey = "local-cpu"',
        watch="verify = false"))  # one comparison is what is tested here, not its escalation
    url = fresh_pg_url
    assert main(["watch", "--config", str(config), "--once", "--no-work", "--db", url]) == 0
    engine = db.make_engine(url)
    assert [(j.device, j.status) for j in jobs(engine)] == [("local-cpu", "queued")]  # the tracker key
    logs = [tmp_path / "other.log", tmp_path / "board.log"]
    other = start_worker(config, url, logs[0], "other-box")
    board_worker = start_worker(config, url, logs[1], "local-cpu")
    try:
        wait_for("the baseline", lambda: all_done(engine), deadline_s=300, logs=logs)
        head = tvm_repo.commit(repo, "next", "A note")
        assert main(["watch", "--config", str(config), "--once", "--no-work", "--db", url]) == 0
        wait_for("the comparison through the board",
                 lambda: len(jobs(engine)) == 2 and all_done(engine), deadline_s=300, logs=logs)
    finally:
        codes = [stop(other), stop(board_worker)]
    assert codes == [0, 0]
    finished = jobs(engine)
    assert [(j.device, j.status, j.payload["sha"]) for j in finished] == \
        [("local-cpu", "done", base), ("local-cpu", "done", head)], [j.error for j in finished]
    # both taken by the board's worker; the other device's worker, polling all along, took none
    assert {j.worker.rpartition(":")[2] for j in finished} == {str(board_worker.pid)}
    assert "for device 'other-box'" in logs[0].read_text()
    with Session(engine) as session:
        run = session.get(Run, finished[1].result["run_id"])
        assert run.status == RunStatus.COMPLETED, run.error
        device = session.get(Device, run.device_id)
        # measured on the board through the tracker
        assert (device.name, device.kind) == ("local-cpu", "rpc")
        assert device.hardware_config == {"rpc_key": "local-cpu", "tracker": tracker}
        records = list(session.scalars(select(Record).where(Record.run_id == run.id)))
        assert len(records) == 2 and {r.hardware for r in records} == {"local-cpu"}
        statuses = {w.commit.sha: w.status for w in session.scalars(select(WatchedCommit))}
    assert statuses == {base: "baseline", head: "ok"}
    assert all(p.poll() is None for p in board)  # the board is still up for its next user
    capsys.readouterr()
    assert main(["status", "--json", "--db", url]) == 0
    assert json.loads(capsys.readouterr().out)["queue"] == {"local-cpu": {"done": 2}}
    engine.dispose()
