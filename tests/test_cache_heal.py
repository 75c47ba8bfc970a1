"""A damaged cache entry heals: it is checked against what it was stored with before it is used,
built again (and the run says so) instead of failing every later comparison, and
``abwatch cache --verify`` reports it."""

from __future__ import annotations

import pytest
import os

from abwatch.builders.cache import ArtifactCache
from tests.test_compare import compare, run_cli


pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

def _truncate(path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(100)


def test_a_truncated_binary_is_rebuilt_and_cache_verify_reports_it(write_config, sqlite_url, tmp_path, capsys):
    config = write_config(repetitions=6)
    code, first, _ = compare(capsys, config, sqlite_url, "base", "noop")
    assert code in (0, 1) and first["status"] == "completed"
    assert run_cli(capsys, "cache", "--config", config, "--verify")[0] == 0
    binaries = sorted((tmp_path / "cache" / "artifacts").glob("*/bench"))
    assert len(binaries) == 2
    _truncate(binaries[0])  # once: every later compare exited 4 with "Exec format error"
    damaged_key = binaries[0].parent.name

    code, _, err = run_cli(capsys, "cache", "--config", config, "--verify")
    assert code == 1 and f"cache entry {damaged_key} is damaged: bench has 100 bytes" in err

    code, again, err = compare(capsys, config, sqlite_url, "base", "noop")
    assert again["status"] == "completed" and code in (0, 1)
    assert all(r["failure"] is None for r in again["results"])
    assert f"cached build {damaged_key} was damaged (bench has 100 bytes" in err and "built again" in err
    assert run_cli(capsys, "cache", "--config", config, "--verify")[0] == 0


def test_a_deduplicated_entry_heals_and_its_object_is_replaced(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    source = tmp_path / "src"
    (source / "lib").mkdir(parents=True)
    (source / "lib" / "libx.so").write_bytes(os.urandom(4096))
    with cache.lock("k1"):
        entry = cache.put_deduplicated("k1", source, {"sha": "a" * 40})
    assert cache.damage("k1", full=True) is None and cache.get("k1") == entry
    _truncate(entry / "lib" / "libx.so")  # a hard link: the stored object is truncated with it
    assert "lib/libx.so has 100 bytes" in cache.damage("k1")
    assert cache.get("k1") is None and "libx.so" in cache.healed["k1"]  # discarded, to be built again
    with cache.lock("k1"):
        entry = cache.put_deduplicated("k1", source, {"sha": "a" * 40})
    assert cache.get("k1") == entry and cache.damage("k1", full=True) is None
    assert (entry / "lib" / "libx.so").read_bytes() == (source / "lib" / "libx.so").read_bytes()
    # same size, other content: only the full check (content hashes) sees it
    (entry / "lib" / "libx.so").write_bytes(os.urandom(4096))
    assert cache.damage("k1") is None and "does not match its content hash" in cache.damage("k1", full=True)


def test_only_a_whole_object_with_the_same_permissions_is_linked_into_a_fetch(tmp_path):
    """What a fetch links from the local objects instead of downloading: an object stored whole,
    with the size and permission bits the manifest gives; a truncated one or the same bytes
    with other permissions is downloaded, so no entry's file changes under another."""
    cache = ArtifactCache(tmp_path / "cache")
    source = tmp_path / "src"
    source.mkdir()
    (source / "run.sh").write_bytes(b"#!/bin/sh\necho ok\n")
    os.chmod(source / "run.sh", 0o755)
    with cache.lock("k1"):
        entry = cache.put_deduplicated("k1", source, {"sha": "a" * 40})
    sha = next(iter(cache._listing("k1").values()))
    staging = cache.staging("k2")
    assert not cache.link_object(sha, 18, 0o644, staging / "same-bytes-not-executable")
    assert not cache.link_object(sha, 17, 0o755, staging / "other-size")
    assert cache.link_object(sha, 18, 0o755, staging / "run.sh")
    assert (staging / "run.sh").stat().st_ino == (entry / "run.sh").stat().st_ino
    (staging / "copy.sh").write_bytes(b"#!/bin/sh\necho ok\n")  # downloaded: the same object
    os.chmod(staging / "copy.sh", 0o755)
    with cache.lock("k2"):
        fetched = cache.adopt_deduplicated("k2", staging, {"run.sh": sha, "copy.sh": sha}, {"sha": "b" * 40})
    assert (fetched / "copy.sh").stat().st_ino == (entry / "run.sh").stat().st_ino  # replaced by the object
    assert cache.get("k2") == fetched and cache.damage("k2", full=True) is None
    cache.discard("k1")
    cache.evict(0, keep={"k2"})  # k1's object is still k2's: kept
    assert cache.get("k2") == fetched and (fetched / "run.sh").read_bytes() == b"#!/bin/sh\necho ok\n"


def test_an_entry_stored_whole_lists_its_files_not_zero(tmp_path):
    # a venv is stored whole (no object listing): `abwatch cache` must not say 0 files for it
    source = tmp_path / "venv"
    (source / "lib" / "site-packages" / "pkg").mkdir(parents=True)
    for name in ("a.py", "b.py", "c.so"):
        (source / "lib" / "site-packages" / "pkg" / name).write_text(name)
    (source / "bin").mkdir()
    (source / "bin" / "python").symlink_to("/usr/bin/python3")  # a link is not a file of the entry
    cache = ArtifactCache(tmp_path / "cache")
    with cache.lock("whole"):
        cache.put("whole", source, {"sha": "0" * 40, "builder": "tvm-wheel"})
    (entry,) = cache.describe()
    assert entry.key == "whole" and entry.files >= 3 and entry.packed_files == 0
    assert entry.files == sum(1 for p in (tmp_path / "cache" / "whole").rglob("*") if p.is_file() and not p.is_symlink())
