"""Code under test is hostile: sandboxed, it finds no secret; whatever it prints is stored and
shown with every secret masked.

A repository whose build script and command workload run a probe that tries every way to
read abwatch's secrets (``/proc/$PPID/environ``, every ``/proc/*/environ``, ``/proc/$PPID/mem``,
the config file, its own environment, PostgreSQL's sockets, ``~/.pgpass``), printing what it
read. ``abwatch compare`` runs as a real process with fake secrets in its environment, on a
real PostgreSQL database; then no row of any table and no API answer or page holds one.
The same probe with ``[sandbox] mode = "off"`` finds them (so the probe works), and still
nothing stored or shown holds one (the masking).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest
import requests
from sqlalchemy import create_engine, inspect, text

from abwatch.builders import sandbox
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import SandboxConfig
from tests.conftest import live_server

SECRETS = {
    "ABWATCH_API_TOKEN": "api-tok-7Hq2Zp",
    "GITHUB_TOKEN": "ghp_fakeGithub9981",
    "ABWATCH_ALERT_SECRET": "hmac-secret-X1y2",
    "SLACK_WEBHOOK_URL": "http://127.0.0.1:9/services/T00/B00/hookpath5521",
    "ABWATCH_READONLY_PASSWORD": "ro-pass-Q8w7",
}
DB_PASSWORD = "pgPass-Zz9911"
CONFIG_CANARY = "config-canary-44Kx"
ALL_SECRETS = {**SECRETS, "db password": DB_PASSWORD, "config file": CONFIG_CANARY}

# The probe: every way to a secret, each reported on its own line; a secret found is printed
# raw with what surrounds it (what a leak would store), and named on the last line. It knows
# the secrets reversed, so its own text gives none away.
PROBE = r'''
import glob, os, re, socket, sys
SECRETS = __SECRETS__
CONFIG = __CONFIG__
found = set()

def check(how, data):
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    hits = [name for name, rev in SECRETS.items() if rev[::-1] in text]
    for name in hits:
        found.add(name)
        at = text.index(SECRETS[name][::-1])
        print(f"probe {how}: LEAK {name}: {text[max(0, at - 40):at + 80]!r}", file=sys.stderr)
    if not hits:
        print(f"probe {how}: read {len(data)} bytes, nothing secret", file=sys.stderr)

def attempt(how, read):
    try:
        check(how, read())
    except Exception as exc:
        print(f"probe {how}: {type(exc).__name__}: {exc}", file=sys.stderr)

def mem(pid):
    parts, total = [], 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:  # the writable regions (heap, stack, environment), at most 256 MB
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if not fields[1].startswith("rw") or end - start > 2**26 or total > 2**28:
                continue
            try:
                mem.seek(start)
                parts.append(mem.read(end - start))
                total += end - start
            except OSError:
                continue
    return b"".join(parts)

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return b"connected to " + path.encode()

def tcp():
    s = socket.create_connection(("127.0.0.1", 5432), timeout=3)
    return b"connected to 127.0.0.1:5432"

def parent(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0

ppid = os.getppid()
print(f"probe {sys.argv[1]}: pid {os.getpid()} ppid {ppid} uid {os.getuid()}", file=sys.stderr)
attempt("ppid-environ", lambda: open(f"/proc/{ppid}/environ", "rb").read())
attempt("ppid-mem", lambda: mem(ppid))
ancestor = ppid
while ancestor > 1:  # a build script's $PPID is the shell abwatch started; abwatch is further up
    ancestor = parent(ancestor)
    if ancestor > 0:
        attempt(f"ancestor-environ {ancestor}", lambda: open(f"/proc/{ancestor}/environ", "rb").read())
        attempt(f"ancestor-mem {ancestor}", lambda: mem(ancestor))
for path in sorted(glob.glob("/proc/[0-9]*/environ")) + sorted(glob.glob("/proc/[0-9]*/cmdline")):
    attempt(f"all {path}", lambda: open(path, "rb").read())
attempt("config", lambda: open(CONFIG, "rb").read())
attempt("environment", lambda: repr(dict(os.environ)))
for sock in ["/run/postgresql/.s.PGSQL.5432", "/var/run/postgresql/.s.PGSQL.5432", "/tmp/.s.PGSQL.5432"]:
    attempt(f"socket {sock}", lambda: unix(sock))
attempt("tcp", tcp)
attempt("pgpass", lambda: open(os.path.expanduser("~/.pgpass"), "rb").read())
print(f"PROBE-FOUND {sys.argv[1]}: {sorted(found)}", file=sys.stderr)
sys.exit(int(sys.argv[2]))
'''


def _host_can_sandbox() -> None:
    # not a skip: a host where these tests cannot run is one where code under test is not confined
    missing = sandbox.probe("bwrap")
    assert missing is None, f"this host cannot sandbox code under test: {missing} (scripts/test.sh installs bubblewrap)"


def _repo(path: Path, config: Path) -> git.Repo:
    """v1 builds (probing), v2's build probes and fails; the workload probes and fails."""
    path.mkdir()
    repo = git.Repo.init(path, initial_branch="main")
    reversed_secrets = {name: value[::-1] for name, value in ALL_SECRETS.items()}
    (path / "probe.py").write_text(PROBE.replace("__SECRETS__", repr(reversed_secrets))
                                   .replace("__CONFIG__", repr(str(config))))
    (path / "build.sh").write_text("mkdir -p out && cp probe.py out/ && python3 probe.py build 0 2>&1\n")
    repo.index.add(["probe.py", "build.sh"])
    repo.index.commit("probing build")
    repo.create_tag("v1")
    (path / "build.sh").write_text("python3 probe.py build 1 2>&1\n")
    repo.index.add(["build.sh"])
    repo.index.commit("failing build")
    repo.create_tag("v2")
    return repo


def _config(tmp_path: Path, repo: Path, mode: str) -> Path:
    config = tmp_path / "abwatch.toml"
    config.write_text(f"""# {CONFIG_CANARY}: a config should hold no secret; if one does, code under test cannot read it
cache_dir = {json.dumps(str(tmp_path / "cache"))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
[[workloads]]
name = "probe"
command = ["python3", "probe.py", "workload", "3"]
[run]
repetitions = 2
warmup = 0
max_repetitions = 2
[alerts]
webhooks = ["env:SLACK_WEBHOOK_URL"]
[github]
repo = "owner/name"
[sandbox]
mode = "{mode}"
""")
    return config


def _abwatch(args: list[str], db_url: str) -> subprocess.CompletedProcess:
    """``abwatch`` as its own process, with the secrets in its environment (as at exec: what
    ``/proc/PID/environ`` shows) and the database password in ``ABWATCH_DATABASE_URL``."""
    env = {**os.environ, **SECRETS, "ABWATCH_DATABASE_URL": db_url}
    return subprocess.run([sys.executable, "-m", "abwatch.service.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def _with_password(url: str) -> str:
    # trust authentication here: the server takes any password, so a fake one can be checked for
    return url.replace("postgres@", f"postgres:{DB_PASSWORD}@", 1)


def _stored_text(url: str) -> str:
    """Every value of every table, as text."""
    engine = create_engine(url)
    parts = []
    with engine.connect() as connection:
        for table in inspect(engine).get_table_names():
            for row in connection.execute(text(f'SELECT * FROM "{table}"')):
                parts.append(" ".join(str(value) for value in row))
    engine.dispose()
    return "\n".join(parts)


def _leaks(text_: str, mode: str = "auto") -> list[str]:
    """The secrets ``text_`` holds. Unsandboxed (``off``) a config file is readable, and what
    it holds is no secret abwatch knows to mask: only the secrets of the environment count."""
    secrets = ALL_SECRETS if mode != "off" else {k: v for k, v in ALL_SECRETS.items() if k != "config file"}
    return [name for name, value in secrets.items() if value in text_]


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_code_under_test_finds_no_secret_and_nothing_stored_or_shown_holds_one(tmp_path, fresh_pg_url, mode):
    if mode == "auto":
        _host_can_sandbox()
    config = _config(tmp_path, tmp_path / "repo", mode)
    _repo(tmp_path / "repo", config)
    url = _with_password(fresh_pg_url)

    failed = _abwatch(["compare", "--config", str(config), "--control", "v1", "--treatment", "v2"], url)
    assert failed.returncode == 3, failed.stderr  # v2's build failed: its log is stored and shown
    probed = _abwatch(["compare", "--config", str(config), "--control", "v1", "--treatment", "v1"], url)
    assert probed.returncode == 4, probed.stderr  # the workload failed: its error is stored and shown
    for proc in (failed, probed):
        assert not _leaks(proc.stdout + proc.stderr, mode), proc.stderr
    warned = "WARNING" in failed.stderr and "unsandboxed" in failed.stderr
    assert warned == (mode == "off"), failed.stderr

    stored = _stored_text(fresh_pg_url)
    assert not _leaks(stored, mode), f"stored: {_leaks(stored, mode)}"
    for where in ("build", "workload"):
        assert f"PROBE-FOUND {where}" in stored, f"the {where} probe did not run (or its output is not stored)"
    for how in ("ppid-environ", "ppid-mem", "config", "environment", "socket /run/postgresql", "tcp"):
        assert f"probe {how}" in stored, how
    if mode == "auto":
        assert "PROBE-FOUND build: []" in stored and "PROBE-FOUND workload: []" in stored
        assert "LEAK" not in stored
        assert "uid 65534" in stored  # another user
        # the workload has a network of its own: PostgreSQL listens on this host's 127.0.0.1:5432, not there
        assert "probe tcp: ConnectionRefusedError" in stored
    else:  # unsandboxed, the probe finds them all (proof that it can), and masking keeps them out
        assert "LEAK" in stored and "***" in stored
        found = stored.split("PROBE-FOUND build: ")[1].splitlines()[0]
        for name in ("ABWATCH_API_TOKEN", "GITHUB_TOKEN", "db password", "config file"):
            assert name in found, found

    runs = [r["id"] for r in json.loads(_abwatch(["runs", "--json"], url).stdout)]
    with live_server(fresh_pg_url, tmp_path / "serve", extra_config="") as base:
        shown = ""
        for run_id in runs:
            for path in (f"/api/runs/{run_id}", f"/runs/{run_id}"):
                answer = requests.get(base + path, timeout=30)
                assert answer.status_code == 200, path
                shown += answer.text
        assert "PROBE-FOUND build" in shown  # the failed build's log is shown ...
        assert not _leaks(shown, mode), f"shown: {_leaks(shown, mode)}"  # ... with no secret in it


def test_a_sandboxed_child_sees_no_process_of_the_host_and_writes_only_where_it_may(tmp_path):
    _host_can_sandbox()
    sandbox.reset()
    writable, readonly = tmp_path / "rw", tmp_path / "ro"
    writable.mkdir()
    readonly.mkdir()
    script = ("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getuid()); "
              f"open({str(writable / 'ok')!r}, 'w').write('x'); open(os.environ['TMPDIR'] + '/t', 'w').write('x');"
              f"open({str(readonly / 'no')!r}, 'w')")
    result = run_process([sys.executable, "-c", script], cwd=tmp_path, env=child_env(), timeout_s=60,
                         sandbox=Sandbox(writable=(writable,)))
    assert result.returncode == 1 and "Read-only file system" in result.stderr, result.stderr
    pids, uid = result.stdout.rsplit(" ", 1)
    assert max(json.loads(pids)) < 10 and int(uid) == 65534  # its own PID namespace: no abwatch, no host
    assert (writable / "ok").exists() and not (readonly / "no").exists()


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_host_that_cannot_sandbox_is_told_loudly_at_start(tmp_path, sqlite_url):
    config = _config(tmp_path, tmp_path / "repo", "auto")
    _repo(tmp_path / "repo", config)
    config.write_text(config.read_text().replace('mode = "auto"', 'bwrap = "/nonexistent/bwrap"'))
    run = _abwatch(["compare", "--config", str(config), "--control", "v1", "--treatment", "v2", "--db", sqlite_url],
                   sqlite_url)
    assert run.returncode == 3, run.stderr  # it goes on, unsandboxed, as before
    assert "WARNING: no sandbox for code under test: /nonexistent/bwrap (bubblewrap) is not installed" in run.stderr
    config.write_text(config.read_text().replace('bwrap = "/nonexistent/bwrap"',
                                                 'bwrap = "/nonexistent/bwrap"\nmode = "on"'))
    run = _abwatch(["compare", "--config", str(config), "--control", "v1", "--treatment", "v2", "--db", sqlite_url],
                   sqlite_url)
    assert run.returncode == 2 and '[sandbox] mode = "on" but this host cannot sandbox' in run.stderr, run.stderr


def test_configure_hides_the_config_file_and_the_listed_paths(tmp_path):
    _host_can_sandbox()
    secret_dir, config = tmp_path / "secrets", tmp_path / "abwatch.toml"
    secret_dir.mkdir()
    (secret_dir / "key").write_text("k3y")
    config.write_text("# c0nfig\n")
    try:
        assert sandbox.configure(SandboxConfig(hide=[str(secret_dir)]), hide=[config]) is None
        result = run_process(["sh", "-c", f"cat {config} {secret_dir}/key; ls {secret_dir}; echo done"],
                             cwd=tmp_path, env=child_env(), timeout_s=60, sandbox=Sandbox())
    finally:
        sandbox.reset()
    assert "done" in result.stdout and "c0nfig" not in result.stdout and "k3y" not in result.stdout, result.stdout


def test_known_secrets_are_masked_in_any_form_and_nothing_else_is(monkeypatch):
    from abwatch.core import redact

    monkeypatch.setenv("ABWATCH_DATABASE_URL", "postgresql://abwatch:p%40ss-word9@db/abwatch")
    monkeypatch.setenv("MY_HOOK", "https://hooks.example.com/services/T0/B0/XYZsecret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_abc123")
    redact.register_secrets(["MY_HOOK"], ["sqlite:////tmp/x.db", "postgresql://u:cli-pass-77@h/d"])
    text = ("pw p@ss-word9 / p%40ss-word9; hook https://hooks.example.com/services/T0/B0/XYZsecret; "
            "token ghp_abc123; cli cli-pass-77; db sqlite:////tmp/x.db")
    masked = redact.mask_secrets(text)
    assert masked == "pw *** / ***; hook ***; token ***; cli ***; db sqlite:////tmp/x.db", masked


def test_a_script_workload_finds_no_secret_either(tmp_path, fresh_pg_url, tvm_cache):
    """A ``script:`` workload's ``workload()`` runs in the TVM harness worker (the build's Python,
    sandboxed): the probe runs there, and its findings come back as the workload's error."""
    _host_can_sandbox()
    reversed_secrets = {name: value[::-1] for name, value in ALL_SECRETS.items()}
    config = tmp_path / "tvm.toml"
    probe = PROBE.replace("__SECRETS__", repr(reversed_secrets)).replace("__CONFIG__", repr(str(config)))
    (tmp_path / "probe_script.py").write_text(f'''import contextlib, io, sys
PROBE = {probe!r}

def workload(**options):
    found = io.StringIO()
    sys.argv = ["probe", "script", "0"]
    with contextlib.redirect_stderr(found):
        try:
            exec(PROBE, {{"__name__": "probe"}})
        except SystemExit:
            pass
    raise RuntimeError(found.getvalue()[-3000:])
''')
    config.write_text(f"""# {CONFIG_CANARY}
cache_dir = {json.dumps(str(tvm_cache))}
[build]
kind = "tvm-wheel"
[runner]
threads = 1
[run]
repetitions = 2
max_repetitions = 2
compile_repetitions = 0
noise_aware = false
[[workloads]]
name = "probe"
kind = "tvm"
model = "script:{tmp_path / 'probe_script.py'}"
""")
    url = _with_password(fresh_pg_url)
    run = _abwatch(["compare", "--config", str(config), "--control", "0.27.0.post1", "--treatment", "0.27.0.post1"],
                   url)
    assert run.returncode == 4, run.stderr[-3000:]
    stored = _stored_text(fresh_pg_url)
    assert "PROBE-FOUND script: []" in stored, stored[-3000:]
    assert "uid 65534" in stored and "LEAK" not in stored
    assert not _leaks(stored + run.stdout + run.stderr)


def test_a_log_cut_inside_a_secret_shows_none_of_it(monkeypatch, tmp_path):
    from abwatch.builders.procs import cut_log

    monkeypatch.setenv("GITHUB_TOKEN", "ghp_0123456789abcdef")
    log = "x" * 100 + "token ghp_0123456789abcdef\nend\n"
    tail = cut_log(log, len("6789abcdef\nend\n"))  # the cut falls inside the token
    assert tail.endswith("***\nend\n") and "6789" not in tail, tail
    # and where run_process itself keeps only a tail
    script = "import sys; sys.stdout.write('y' * 100000 + 'ghp_0123456789abcdef' + 'z' * 10)"
    result = run_process([sys.executable, "-c", script], cwd=tmp_path, env=child_env(), timeout_s=60,
                         sandbox=None, keep=16)
    assert result.stdout == "***" + "z" * 10 and result.cut == 100000 + 14, result
