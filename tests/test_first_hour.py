"""What a new user sees first from the commands that only read: no empty tables, no files made."""

from __future__ import annotations

from abwatch.service.cli.main import main


def test_status_without_a_watch_says_so_instead_of_an_empty_table(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'abwatch.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    capsys.readouterr()
    assert main(["status", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "no branch is watched" in out and "watched branches" not in out
    assert "open regressions: 0" in out
