"""Child processes: time limits that hold against stubborn children, and no leaked secrets."""

from __future__ import annotations

import pytest
import os
import sys
import time

import git
import psutil

from abwatch.builders.builder import BuildFailed
from abwatch.runners import CpuRunner
from abwatch.service.config import CommandWorkloadConfig
from abwatch.builders.procs import child_env, run_process

# A child that starts a grandchild in a session of its own which keeps stdout open and
# writes its pid, then exits at once: the grandchild escapes the process group.
ESCAPING = """
import os, subprocess, sys, time
pid_file = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(pid_file, "w").write(str(child.pid))
print('{"runtime_ms": 1.0}', flush=True)
time.sleep(float(sys.argv[2]))
"""


def _repo(path, files: dict[str, str]) -> git.Repo:
    """A one-commit git repository holding ``files``."""
    repo = git.Repo.init(path)
    for name, text in files.items():
        (path / name).write_text(text)
    repo.index.add(list(files))
    repo.index.commit("build script")
    return repo


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_timeout_is_not_held_by_a_grandchild_that_keeps_stdout_open(tmp_path):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    result = run_process([sys.executable, "-c", ESCAPING, str(pid_file), "30"], cwd=tmp_path,
                         env=child_env(), timeout_s=2.0, sandbox=None)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.returncode is None
    assert elapsed < 10, f"a 2 s limit held the caller for {elapsed:.1f} s"
    assert '"runtime_ms": 1.0' in result.stdout  # what was printed before the limit is kept
    assert _gone(int(pid_file.read_text())), "the escaped grandchild was left running"


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_child_that_exits_while_a_grandchild_holds_the_pipe_returns_at_the_limit(tmp_path):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    result = run_process([sys.executable, "-c", ESCAPING, str(pid_file), "0"], cwd=tmp_path,
                         env=child_env(), timeout_s=2.0, sandbox=None)
    assert time.monotonic() - start < 10
    assert result.returncode == 0 and '"runtime_ms": 1.0' in result.stdout
    assert _gone(int(pid_file.read_text()))


def _running(marker: str) -> list[psutil.Process]:
    """This host's processes whose command line holds ``marker`` (pids inside a sandbox are not the host's)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or ()) and proc.status() != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _none_left(marker: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(marker)


# A workload whose grandchild starts a session of its own and outlives it (a sleep named by a marker).
ESCAPING_MARKED = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]], start_new_session=True)
print('{"runtime_ms": 1.0}', flush=True)
time.sleep(30)
"""


def test_workload_timeout_kills_the_whole_tree(tmp_path):
    marker = f"escaped-{os.getpid()}-{time.monotonic_ns()}"
    workload = CommandWorkloadConfig(name="stubborn", command=[sys.executable, "-c", ESCAPING_MARKED, marker])
    start = time.monotonic()
    result = CpuRunner().run(tmp_path, workload, timeout_s=2.0)
    assert result.status == "timeout"
    assert time.monotonic() - start < 10
    assert _none_left(marker), "the escaped grandchild was left running"


def test_secrets_do_not_reach_workloads(tmp_path, monkeypatch):
    monkeypatch.setenv("ABWATCH_DATABASE_URL", "postgresql://abwatch:hunter2@db/abwatch")
    monkeypatch.setenv("ABWATCH_API_TOKEN", "t0ken")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret")
    printer = "import json, os; print(json.dumps({'runtime_ms': 1.0, 'env': dict(os.environ)}))"
    workload = CommandWorkloadConfig(name="env", command=[sys.executable, "-c", printer],
                                     env={"NAMED_IN_CONFIG": "yes"})
    result = CpuRunner().run(tmp_path, workload, timeout_s=30)
    assert result.status == "ok", result.message
    env = child_env({"NAMED_IN_CONFIG": "yes"})
    assert "ABWATCH_DATABASE_URL" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["NAMED_IN_CONFIG"] == "yes" and env["PATH"] == os.environ["PATH"]


def test_secrets_do_not_reach_builds(tmp_path, monkeypatch):
    from tests.test_builders import builder_for
    monkeypatch.setenv("ABWATCH_DATABASE_URL", "postgresql://abwatch:hunter2@db/abwatch")
    repo = _repo(tmp_path / "src", {"build.sh": "mkdir -p out; env > out/env.txt\n"})
    builder = builder_for(repo.working_dir, tmp_path / "cache")
    artifact = builder.build(repo.head.commit.hexsha)
    seen = (artifact.path / "env.txt").read_text()
    assert "hunter2" not in seen and "ABWATCH_DATABASE_URL" not in seen
    assert f"ABWATCH_COMMIT={repo.head.commit.hexsha}" in seen


def test_build_timeout_kills_the_build_and_its_children(tmp_path):
    from tests.test_builders import builder_for
    marker = f"build-child-{os.getpid()}-{time.monotonic_ns()}"
    repo = _repo(tmp_path / "src", {"build.sh": "sh -c 'sleep 60' \"$MARKER\" & wait\n"})
    builder = builder_for(repo.working_dir, tmp_path / "cache")
    builder.config = builder.config.model_copy(update={"timeout_s": 2.0, "env": {"MARKER": marker}})
    start = time.monotonic()
    try:
        builder.build(repo.head.commit.hexsha)
    except BuildFailed as exc:
        assert "timed out" in str(exc)
    else:
        raise AssertionError("a build over its time limit must fail")
    assert time.monotonic() - start < 15
    assert _none_left(marker)
