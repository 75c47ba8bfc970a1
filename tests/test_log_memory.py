"""A build that prints a gigabyte costs abwatch a few megabytes: only a bounded tail of its
output is held, and the stored log is that tail, marked as cut.

``abwatch compare`` runs as its own process (a real git repository, a real build, real
PostgreSQL); its peak resident memory (``ru_maxrss``) is compared with the same compare whose
build prints a few lines.
"""

from __future__ import annotations

import pytest
import json
import subprocess
import sys
from pathlib import Path

import git
from sqlalchemy import create_engine, text

GIB = 2**30
# a build that prints ``$1`` MiB of 100-byte lines, then a last line, and fails (its log is stored)
PRINTER = """
import sys
line = b"x" * 99 + b"\\n"
block = line * 10486  # ~1 MiB
for _ in range(int(sys.argv[1])):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.write(b"END-OF-LOG\\n")
sys.exit(1)
"""
# abwatch's own entry point, reporting its peak resident memory (KiB on Linux) when it ends
MEASURED = """
import resource, sys
from abwatch.service.cli.main import main
code = main(sys.argv[1:])
print("PEAK-RSS-KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def _repo(path: Path) -> None:
    path.mkdir()
    repo = git.Repo.init(path, initial_branch="main")
    (path / "printer.py").write_text(PRINTER)
    (path / "build.sh").write_text('mkdir -p out && python3 printer.py "$MIB"\n')
    repo.index.add(["printer.py", "build.sh"])
    repo.index.commit("a loud build")
    repo.create_tag("v1")


def _compare(tmp_path: Path, db_url: str, mib: int) -> tuple[int, str]:
    """Peak RSS (bytes) of ``abwatch compare`` whose build prints ``mib`` MiB; the stored log."""
    config = tmp_path / f"abwatch-{mib}.toml"
    config.write_text(f"""cache_dir = {json.dumps(str(tmp_path / "cache"))}
[repo]
url = {json.dumps(str(tmp_path / "repo"))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
env = {{MIB = "{mib}"}}
[[workloads]]
name = "never-run"
command = ["true"]
""")
    proc = subprocess.run([sys.executable, "-c", MEASURED, "compare", "--config", str(config), "--control", "v1",
                           "--treatment", "v1", "--db", db_url], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 3, proc.stderr[-2000:]  # the build failed, as it should
    peak = int(proc.stderr.rsplit("PEAK-RSS-KIB", 1)[1].split()[0]) * 1024
    engine = create_engine(db_url)
    with engine.connect() as connection:
        log = connection.execute(text("SELECT log FROM builds ORDER BY id DESC LIMIT 1")).scalar_one()
    engine.dispose()
    return peak, log


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_gigabyte_of_build_output_keeps_memory_flat_and_stores_the_cut_tail(tmp_path, fresh_pg_url):
    _repo(tmp_path / "repo")
    quiet_peak, quiet_log = _compare(tmp_path, fresh_pg_url, 0)
    assert quiet_log.startswith("END-OF-LOG")  # nothing cut, nothing marked
    loud_peak, loud_log = _compare(tmp_path, fresh_pg_url, 1024)
    print(f"peak RSS: {quiet_peak / 2**20:.0f} MiB quiet, {loud_peak / 2**20:.0f} MiB with a 1 GiB log")
    # flat: the gigabyte adds at most a few tails' worth (4 MiB each), far below its own size
    assert loud_peak < quiet_peak + 128 * 2**20, (quiet_peak, loud_peak)
    # and far below the gigabyte itself (on a loaded CI machine the quiet run alone reached 320-440 MiB)
    assert loud_peak < GIB / 2
    # the tail, with the end of the output, then abwatch's line saying what failed
    assert loud_log.rstrip().splitlines()[-2] == "END-OF-LOG"
    assert loud_log.rstrip().splitlines()[-1].startswith("abwatch: build of ")
    assert loud_log.startswith("[abwatch: log cut: its first ")  # marked as cut, saying how much
    cut = int(loud_log.split("its first ", 1)[1].split()[0])
    assert cut > GIB - 2**20
    assert len(loud_log) < 250_000  # the builder's limit and its mark
