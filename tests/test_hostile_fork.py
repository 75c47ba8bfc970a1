"""A hostile fork's code on a host where abwatch runs as root: what it can reach, and what it
can take of the host.

Real bubblewrap, real processes, real PostgreSQL and Redis on 127.0.0.1, a real HTTP server
standing for the API and the artifact store. abwatch runs as root here (as docs/fleet.md
deploys it), so each check is the attack on a real fleet host: code under test runs as the
sandbox's own unprivileged host user, has no network, and is held to its limits.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import git
import psutil
import pytest

from abwatch.builders import sandbox
from abwatch.builders.builder import BuildFailed
from abwatch.builders.command import CommandBuilder
from abwatch.builders.limits import make_cgroup
from abwatch.builders.nofollow import read_inside, write_inside
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.sandbox import Sandbox, UntrustedRefused
from abwatch.builders.spec import SandboxConfig
from abwatch.runners import CpuRunner
from abwatch.service.config import CommandBuildConfig, CommandWorkloadConfig, Config, RepoConfig


def _as_root() -> None:
    # not a skip: these check the switch to the sandbox's user, which abwatch makes as root
    # (scripts/test.sh and CI run as root); elsewhere they fail saying so
    assert os.geteuid() == 0, "tests/test_hostile_fork.py runs as root: abwatch switches users only as root"

SECRET = "root-only-secret-5Kp2"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----fake-7Yq1"


@pytest.fixture
def host(tmp_path):
    """A host as a fleet's: a root-owned 0600 file and an ssh key (neither hidden), PostgreSQL,
    Redis, and an HTTP server standing for the API and the artifact store, all on 127.0.0.1."""
    _as_root()
    missing = sandbox.probe("bwrap")
    assert missing is None, f"this host cannot sandbox code under test: {missing}"
    secrets = tmp_path / "etc-abwatch"
    secrets.mkdir(mode=0o755)
    (secrets / "fleet.env").write_text(f"ABWATCH_STORE_PASSWORD={SECRET}\n")
    (secrets / "fleet.env").chmod(0o600)
    ssh = tmp_path / "ssh"
    ssh.mkdir(mode=0o755)  # even with a careless directory, the key itself is 0600 and root's
    (ssh / "id_ed25519").write_text(KEY)
    (ssh / "id_ed25519").chmod(0o600)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sandbox.configure(SandboxConfig(max_processes=64, max_memory_gb=0.25))
    yield {"files": [secrets / "fleet.env", ssh / "id_ed25519"], "ports": {"postgresql": 5432, "redis": 6379,
                                                                          "api": server.server_address[1]}}
    server.shutdown()
    server.server_close()
    sandbox.reset()


# Reads each file and connects to each port, printing one line per attempt.
PROBE = """
import os, socket, sys
files, ports = sys.argv[1].split(","), sys.argv[2].split(",")
print("uid", os.getuid())
for path in files:
    try:
        print("READ", path, open(path).read())
    except OSError as exc:
        print("refused", path, exc.strerror)
for port in ports:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        print("CONNECTED", port)
    except OSError as exc:
        print("refused", port, exc.strerror or exc)
"""


def _probe_args(host) -> list[str]:
    return [",".join(str(f) for f in host["files"]), ",".join(str(p) for p in host["ports"].values())]


def _assert_nothing_reached(output: str, host) -> None:
    assert SECRET not in output and KEY not in output, output
    assert "READ" not in output and "CONNECTED" not in output, output
    refused = [line for line in output.splitlines() if line.startswith("refused ")]
    assert len(refused) == len(host["files"]) + len(host["ports"]), output


def _hostile_repo(path: Path, build: str) -> str:
    path.mkdir()
    repo = git.Repo.init(path, initial_branch="main")
    (path / "probe.py").write_text(PROBE)
    (path / "build.sh").write_text(build)
    repo.index.add(["probe.py", "build.sh"])
    return repo.index.commit("a fork's commit").hexsha


def _builder(tmp_path: Path, repo: Path) -> CommandBuilder:
    return CommandBuilder(Config(repo=RepoConfig(url=str(repo)), cache_dir=tmp_path / "cache",
                                 build=CommandBuildConfig(command=["sh", "build.sh"], artifacts="out"),
                                 workloads=[CommandWorkloadConfig(name="w", command=["true"])]))


def test_a_forks_build_reads_no_root_file_and_reaches_no_server(tmp_path, host):
    args = " ".join(f"'{a}'" for a in _probe_args(host))
    sha = _hostile_repo(tmp_path / "repo", f"mkdir -p out && python3 probe.py {args} > out/probe.txt 2>&1\n")
    # even with the network granted to trusted builds, a try job's build has none
    sandbox.configure(SandboxConfig(build_network=True, max_processes=64))
    with sandbox.untrusted():
        artifact = _builder(tmp_path, tmp_path / "repo").build(sha)
    output = (artifact.path / "probe.txt").read_text()
    assert "uid 65534" in output
    _assert_nothing_reached(output, host)


def test_a_forks_workload_reads_no_root_file_and_reaches_no_server(tmp_path, host):
    workload = CommandWorkloadConfig(name="probe", command=[sys.executable, "-c", PROBE, *_probe_args(host)])
    result = CpuRunner().run(tmp_path, workload, timeout_s=60.0)
    assert result.status == "error"  # it printed no figure; its stderr is the probe's ...
    proc = run_process([sys.executable, "-c", PROBE, *_probe_args(host)], cwd=tmp_path, env=child_env(),
                       timeout_s=60, sandbox=Sandbox())
    _assert_nothing_reached(proc.stdout, host)  # ... and what it saw, nothing
    # the same probe outside the sandbox reads and connects: the probe works
    bare = run_process([sys.executable, "-c", PROBE, *_probe_args(host)], cwd=tmp_path, env=child_env(),
                       timeout_s=60, sandbox=None)
    assert SECRET in bare.stdout and "CONNECTED 5432" in bare.stdout


def test_a_fork_bomb_is_capped_and_the_host_keeps_its_processes(tmp_path, host):
    marker = f"fork-bomb-{os.getpid()}-{time.monotonic_ns()}"  # in every bomb process's command line
    bomb = (f"# {marker}\nimport os, time\nn = 0\ntry:\n    while n < 2000:\n        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as exc:\n"
            "    print('capped at', n, exc.strerror, flush=True)\n")
    proc = run_process([sys.executable, "-c", bomb], cwd=tmp_path, env=child_env(), timeout_s=60, sandbox=Sandbox())
    assert "capped at" in proc.stdout, proc.stdout + proc.stderr
    forked = int(proc.stdout.split("capped at")[1].split()[0])
    assert 0 < forked < 64  # [sandbox] max_processes = 64
    # its sleeping children went with it (counted by their command line: other tests beside this
    # one start and end processes of their own meanwhile)
    deadline = time.monotonic() + 10
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def test_kill_9_is_stored_as_sigkill_and_a_memory_bomb_as_out_of_memory(tmp_path, host):
    killed = CpuRunner().run(tmp_path, CommandWorkloadConfig(name="k", command=["sh", "-c", "kill -9 $$"]),
                             timeout_s=30.0)
    assert killed.status == "error" and killed.message.startswith("killed by SIGKILL"), killed.message
    assert "Traceback" not in killed.message
    bomb = CommandWorkloadConfig(name="m", command=[sys.executable, "-c",
                                                    "x = []\nwhile True: x.append(bytearray(2**24))"])
    result = CpuRunner().run(tmp_path, bomb, timeout_s=60.0)
    assert result.status == "error"
    if make_cgroup(sandbox.policy().limits) is not None:  # a cgroup holds the limit: the kernel kills
        assert result.message.startswith("killed by SIGKILL: out of memory"), result.message
        assert "max_memory_gb = 0.25" in result.message
    else:  # each process's RLIMIT_DATA: the allocation fails
        assert "MemoryError" in result.message, result.message


def _marked(marker: str) -> list[psutil.Process]:
    """The processes whose command line holds ``marker``."""
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_without_a_sandbox_nothing_an_invocation_started_outlives_it(tmp_path):
    sandbox.configure(SandboxConfig(mode="off"))
    try:
        marker = f"spinner-{os.getpid()}-{time.monotonic_ns()}"
        spin = f"import os, subprocess, sys\nsubprocess.Popen(['sh', '-c', 'while :; do :; done', '{marker}'], " \
               "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={})\n" \
               "print('{\"runtime_ms\": 1.0}')\n"
        result = CpuRunner().run(tmp_path, CommandWorkloadConfig(name="s", command=[sys.executable, "-c", spin]),
                                 timeout_s=30.0)
        assert result.status == "ok", result.message
        time.sleep(0.3)
        left = _marked(marker)
        assert not left, left
        # and code nobody merged is refused on such a host unless the operator accepts the risk
        with pytest.raises(UntrustedRefused, match="unsandboxed_untrusted"), sandbox.untrusted():
            pass
        sandbox.configure(SandboxConfig(mode="off", unsandboxed_untrusted=True))
        with sandbox.untrusted():
            assert sandbox.running_untrusted()
        assert not sandbox.running_untrusted()
    finally:
        sandbox.reset()


# abwatch starting a long-lived sandboxed worker (as a TVM fork server is started) from a
# thread that then ends, and staying alive: then it is SIGKILLed, as an operator or the OOM
# killer would end it
LONG_LIVED = """
import sys, threading, time
from abwatch.builders import sandbox
from abwatch.builders.procs import launch
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import SandboxConfig
sandbox.configure(SandboxConfig())
assert sandbox.policy().enabled
argv = Sandbox().wrap(["sh", "-c", "while :; do sleep 1; done", sys.argv[1]], None, sys.argv[2])
asker = threading.Thread(target=lambda: launch(argv, start_new_session=True))
asker.start()
asker.join()
print("started", flush=True)
time.sleep(600)
"""


def test_a_long_lived_worker_outlives_the_thread_that_started_it_but_not_abwatch(tmp_path, host):
    marker = f"long-lived-{os.getpid()}-{time.monotonic_ns()}"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    abwatch = subprocess.Popen([sys.executable, "-c", LONG_LIVED, marker, str(scratch)], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert abwatch.stdout is not None and abwatch.stdout.readline() == "started\n"
        time.sleep(1.0)
        assert _marked(marker), "the worker died with the thread that asked for it"
    finally:
        abwatch.kill()
        abwatch.wait()
        if abwatch.stdout is not None:
            abwatch.stdout.close()
    deadline = time.monotonic() + 30
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(marker), "the sandboxed worker outlived a SIGKILLed abwatch"


def test_abwatch_never_writes_or_reads_through_a_link_the_build_planted(tmp_path):
    base = tmp_path / "cache"
    (base / "ws" / "build").mkdir(parents=True)
    target = tmp_path / "host-file"
    target.write_text("the host's")
    (base / "ws" / "build" / "config.cmake").symlink_to(target)
    with pytest.raises(OSError):
        read_inside(base, "ws/build/config.cmake")  # a link is not read
    write_inside(base, "ws/build/config.cmake", "set(X 1)\n")
    assert target.read_text() == "the host's"  # replaced, not written through
    assert (base / "ws" / "build" / "config.cmake").read_text() == "set(X 1)\n"
    (base / "ws" / "build").rename(base / "ws" / "real")
    (base / "ws" / "build").symlink_to(tmp_path)  # a directory swapped for a link
    with pytest.raises(OSError):
        write_inside(base, "ws/build/host-file", "x")
    assert target.read_text() == "the host's"


def test_handing_a_tree_to_the_sandbox_user_changes_links_not_what_they_name(tmp_path, host):
    tree = tmp_path / "workspace"
    (tree / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("root's")
    (tree / "sub" / "link").symlink_to(outside)
    (tree / "dirlink").symlink_to(tmp_path)
    sandbox.grant(str(tree))
    uid = sandbox.policy().uid
    assert os.lstat(tree / "sub" / "link").st_uid == uid and (tree / "sub").stat().st_uid == uid
    assert outside.stat().st_uid == 0 and tmp_path.stat().st_uid == 0


def test_a_build_that_cannot_reach_a_server_fails_as_a_build(tmp_path, host):
    port = host["ports"]["api"]
    fetch = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\"\n"
    sha = _hostile_repo(tmp_path / "repo", fetch)
    with pytest.raises(BuildFailed, match="exited with status 1"):
        _builder(tmp_path, tmp_path / "repo").build(sha)
    socket.create_connection(("127.0.0.1", port), timeout=3).close()  # the server is up: the sandbox cut it


def test_a_missing_sandbox_user_falls_back_to_nobody_and_says_how_to_make_it():
    _as_root()
    try:
        note = sandbox.configure(SandboxConfig(user="no-such-abwatch-user"))
        assert sandbox.policy().user == "nobody" and sandbox.policy().uid not in (None, 0)
        assert note is not None and "useradd --system" in note and "no-such-abwatch-user" in note
    finally:
        sandbox.reset()
