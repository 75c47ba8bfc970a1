"""The command line starts fast: ``--help``, ``--version`` and usage errors import no database,
statistics or web code, and the read commands leave the numerical and web stacks alone.
(The start-up times themselves are measured by ``python -m benchmarks.cli_startup``.)"""

from __future__ import annotations

import pytest
import contextlib
import json
import subprocess
import sys

from abwatch.service.cli import main as cli
from abwatch.service.store import db

HEAVY = ("sqlalchemy", "scipy", "numpy", "alembic", "fastapi", "rich", "pydantic", "git", "requests")


def _modules_after(code: str) -> set[str]:
    probe = f"""
import json, sys
{code}
print(json.dumps(sorted(sys.modules)))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_help_and_version_import_nothing_heavy():
    for argv in (["--version"], ["--help"], ["compare"]):  # the last: a usage error from the parser
        loaded = _modules_after(f"""
from abwatch.service.cli import main as cli
try:
    cli.main({argv!r})
except SystemExit:
    pass
""")
        assert not {m for m in loaded if m.split(".")[0] in HEAVY}, argv


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_read_commands_do_not_import_the_numerical_or_web_stack(sqlite_url):
    url = sqlite_url  # at head: read commands never migrate
    for argv in (["regressions", "--db", url], ["status", "--db", url], ["runs", "--db", url]):
        loaded = _modules_after(f"from abwatch.service.cli import main as cli\nassert cli.main({argv!r}) == 0")
        assert not {m for m in loaded if m.split(".")[0] in ("scipy", "fastapi", "uvicorn", "tvm")}, argv


def test_the_parser_names_the_database_defaults_the_database_code_uses():
    assert (cli.ENV_DATABASE_URL, cli.DEFAULT_DATABASE_URL) == (db.ENV_DATABASE_URL, db.DEFAULT_DATABASE_URL)


def test_help_lists_every_exit_code(capsys):
    with contextlib.suppress(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "130 "):
        assert f"{code}" in text
    for words in ("no regression", "a regression", "usage or config error", "a build failed", "incomplete",
                  "internal error", "interrupted"):
        assert words in text, words


def test_config_errors_found_after_loading_name_the_file(tmp_path, capsys):
    from abwatch.service.cli.demo import make_demo_repo
    from tests.test_watch import step, write_watch_config

    make_demo_repo(tmp_path / "repo", (step("base", "Baseline"),))
    for watch_section, key in (('start = "no-such-ref"', "watch.start"), ('control = "fixed:nope"', "watch.control")):
        config = write_watch_config(tmp_path, tmp_path / "repo", watch_section)
        capsys.readouterr()
        assert cli.main(["watch", "--config", config, "--once", "--db", f"sqlite:///{tmp_path / 'w.db'}"]) == 2
        assert f"{config}: {key}: " in capsys.readouterr().err
