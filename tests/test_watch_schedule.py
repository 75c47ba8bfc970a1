"""Nightly mode in the long-running ``abwatch watch``: a real process on a cron ``schedule``
whose ticks come every 5 seconds (the 6-field form, seconds first), a real git branch that
grows between ticks. Each tick tests the branch head (no ``--once``); SIGTERM ends it with 0.
"""

from __future__ import annotations

import pytest
import re
import signal
import subprocess
import sys

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.store import db
from abwatch.service.cli.main import main
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.store.models import Job, WatchedCommit

from tests.test_watch import shas, step, write_watch_config
from tests.test_watch_workers import wait_for


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def watched(engine) -> dict[str, tuple[str, str | None]]:
    with Session(engine) as session:
        return {w.commit.sha: (w.status, w.control_sha) for w in session.scalars(select(WatchedCommit))}


def test_cron_ticks_test_the_branch_head_until_sigterm(tmp_path, sqlite_url):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    config = write_watch_config(tmp_path, repo, 'schedule = "*/5 * * * * *"')
    log = tmp_path / "watch.log"
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "abwatch.service.cli.main", "watch", "--config", config,
                                 "--db", sqlite_url], stdout=out, stderr=subprocess.STDOUT)
    engine = db.make_engine(sqlite_url)

    def seen(sha: str, status: str):
        """The commit has ``status`` and its job is over (SIGTERM then finds the watch idle)."""
        def check():
            assert proc.poll() is None, log.read_text()
            try:
                with Session(engine) as session:
                    idle = all(j.status == "done" for j in session.scalars(select(Job)))
                return idle and watched(engine).get(sha, ("", None))[0] == status
            except Exception:  # the watch may still be creating the schema
                return False
        return check

    try:
        tags = shas(repo)
        wait_for("the first tick's baseline", seen(tags["base"], "baseline"), deadline_s=120, logs=[log])
        make_demo_repo(repo, (step("n1", "README", note="n1"), step("n2", "README again", note="n2")))
        tags = shas(repo)
        wait_for("a later tick to test the head", seen(tags["n2"], "ok"), deadline_s=180, logs=[log])
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 0, text  # stopped while idle: a clean exit
    # nightly mode: the head alone, compared with the last head tested; n1 is never taken up
    assert watched(engine) == {tags["base"]: ("baseline", None), tags["n2"]: ("ok", tags["base"])}
    # the first pass waited for a tick of the schedule: a time whose seconds are a multiple of 5
    first = re.search(r"schedule \*/5 \* \* \* \* \* \(UTC\); first pass \S+T\d\d:\d\d:(\d\d)", text)
    assert first and int(first.group(1)) % 5 == 0, text
    engine.dispose()


def test_a_bad_schedule_is_a_config_error_naming_the_key(tmp_path, sqlite_url, capsys):
    repo = tmp_path / "repo"
    make_demo_repo(repo, (step("base", "Baseline"),))
    for bad, says in (('"99 * * * * *"', "the last value (99) is higher than the maximum value (59)"),
                      ('"* * * * * * *"', "7 fields; expected 5"),
                      ('"0 2 * *"', "4 fields; expected 5")):
        config = write_watch_config(tmp_path, repo, f"schedule = {bad}")
        capsys.readouterr()
        assert main(["watch", "--config", config, "--once", "--db", sqlite_url]) == 2
        err = capsys.readouterr().err
        assert f"{config}: watch.schedule: value error, not a cron expression" in err, err
        assert says in err, err
