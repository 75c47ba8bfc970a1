"""A git repository whose "build" is a released apache-tvm (a cached ``tvm-wheel`` venv),
so the watch and its workers can be tested on real TVM with real commits in
seconds instead of the hours a TVM source build takes.

Each commit's ``build.sh`` writes the artifact's ``abwatch-artifact.json`` naming the venv's
Python (the commits differ only in a note).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, UTC
from email.utils import format_datetime
from pathlib import Path

import git

BUILD_SH = """set -e
mkdir -p out
printf '{"python": "%s"}' "$TVM_PYTHON" > out/abwatch-artifact.json
"""


def commit(path: Path, tag: str, message: str, files: dict[str, str] | None = None) -> str:
    """Add one tagged commit to the repository at ``path`` (created if needed); its sha.
    ``files`` (name -> text) are written too, and may replace ``build.sh``."""
    path.mkdir(parents=True, exist_ok=True)
    repo = git.Repo(path) if (path / ".git").exists() else git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "abwatch test")
        cfg.set_value("user", "email", "test@abwatch.invalid")
    (path / "build.sh").write_text(BUILD_SH)
    (path / "NOTES.md").write_text(f"{tag}\n")
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    repo.index.add(["build.sh", "NOTES.md", *(files or {})])
    count = int(repo.git.rev_list("--count", "HEAD")) if repo.head.is_valid() else 0
    date = format_datetime(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=count))
    made = repo.index.commit(message, author_date=date, commit_date=date)
    repo.create_tag(tag)
    return made.hexsha


def config_text(tmp_path: Path, repo: Path, python: str, *, workloads: str, runner: str, run: str,
                watch: str = "") -> str:
    """A watch config of the TVM repository ``repo`` (builds name ``python`` as their TVM)."""
    return f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "build.sh"]
artifacts = "out"
env = {{TVM_PYTHON = {json.dumps(python)}}}
{workloads}
[run]
{run}
noise_aware = false
[runner]
{runner}
[watch]
{watch}
"""
