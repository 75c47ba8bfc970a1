"""The artifact cache's delta packing: older builds of a series kept as Zstandard deltas.

Real files, real zstandard, real flocks. The "libraries" are 2 MiB of seeded random bytes
with a few edits and an insertion per build, as a relinked library differs from its
neighbour's; random bytes make sure the saving comes from the delta, not from plain
compression.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from abwatch.builders.cache import ArtifactCache
from abwatch.builders.objects import ObjectStore, sha256_file

SIZE = 2 << 20


def library(version: int) -> bytes:
    """Version ``version`` of a library: version 0 plus ``version`` rounds of small edits."""
    rng = random.Random(7)
    data = bytearray(rng.randbytes(SIZE))
    for round_ in range(version):
        edits = random.Random(100 + round_)
        for _ in range(50):
            at = edits.randrange(len(data) - 16)
            data[at:at + 8] = edits.randbytes(8)
        at = edits.randrange(len(data))
        data[at:at] = edits.randbytes(300)  # everything after it moves, as in a relink
    return bytes(data)


def put_build(cache: ArtifactCache, tmp_path: Path, key: str, version: int, series: str | None = "s") -> Path:
    source = tmp_path / f"src-{key}"
    (source / "lib").mkdir(parents=True)
    (source / "lib" / "libtvm.so").write_bytes(library(version))
    (source / "python.py").write_text(f"VERSION = {version}\n")
    return cache.put_deduplicated(key, source, {"sha": key}, series=series)


def test_older_build_is_packed_and_rebuilt_byte_for_byte(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    first = put_build(cache, tmp_path, "k1", 0)
    one_build = cache.size_bytes()
    put_build(cache, tmp_path, "k2", 1)
    # k1's library is now a delta against k2's: it left k1's directory, the cache barely grew
    assert not (first / "lib" / "libtvm.so").exists()
    assert (first / "python.py").exists()
    assert cache.size_bytes() < 1.2 * one_build
    # using k1 rebuilds it, identical to what was built
    with cache.hold("k1") as path:
        assert path == first
        assert (path / "lib" / "libtvm.so").read_bytes() == library(0)


def test_ten_builds_fit_in_one_and_a_half(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    put_build(cache, tmp_path, "k0", 0)
    one_build = cache.size_bytes()
    for version in range(1, 10):
        put_build(cache, tmp_path, f"k{version}", version)
    assert cache.size_bytes() <= 1.5 * one_build
    # the oldest is rebuilt through a chain of deltas
    assert cache.objects.chain_length(sha256_file_of(library(0), tmp_path)) >= 2
    assert (cache.get("k0") / "lib" / "libtvm.so").read_bytes() == library(0)
    assert (cache.get("k5") / "lib" / "libtvm.so").read_bytes() == library(5)


def sha256_file_of(data: bytes, tmp_path: Path) -> str:
    path = tmp_path / "probe"
    path.write_bytes(data)
    return sha256_file(path)


def test_chains_are_bounded(tmp_path):
    cache = ArtifactCache(tmp_path / "cache", max_chain=3)
    for version in range(8):
        put_build(cache, tmp_path, f"k{version}", version)
    chains = [cache.objects.chain_length(sha256_file_of(library(v), tmp_path)) for v in range(8)]
    assert max(chains) <= 3
    assert chains.count(0) >= 2  # the newest and at least one that stayed whole to bound the chains
    for version in range(8):
        assert (cache.get(f"k{version}") / "lib" / "libtvm.so").read_bytes() == library(version)


def test_held_entry_is_not_packed_or_evicted(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    put_build(cache, tmp_path, "k1", 0)
    with cache.hold("k1") as path:
        put_build(cache, tmp_path, "k2", 1)
        assert (path / "lib" / "libtvm.so").read_bytes() == library(0)
        assert cache.evict(0, keep={"k2"}) == []
        assert (path / "lib" / "libtvm.so").exists()
    # released: the next build of the series packs it, eviction may remove it
    put_build(cache, tmp_path, "k3", 2)
    assert not (path / "lib" / "libtvm.so").exists()
    assert "k1" in cache.evict(0, keep={"k3"})


def test_evicting_the_base_keeps_the_delta_rebuildable(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    put_build(cache, tmp_path, "k1", 0)
    put_build(cache, tmp_path, "k2", 1)
    # k2 is the base of k1's delta; evict k2 (and k1 stays, packed)
    for key in ("k1", "k2"):
        (cache.path(key) / ".abwatch-complete").touch()  # k1 used most recently: k2 goes first
    removed = cache.evict(int(cache.size_bytes() * 0.9), keep={"k1"})
    assert removed == ["k2"]
    assert (cache.get("k1") / "lib" / "libtvm.so").read_bytes() == library(0)
    with pytest.raises(FileNotFoundError, match="k2"), cache.hold("k2"):
        pass


def test_other_series_and_unlike_files_stay_whole(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    first = put_build(cache, tmp_path, "a1", 0, series="runtime-only")
    put_build(cache, tmp_path, "b1", 1, series="full")
    assert (first / "lib" / "libtvm.so").exists()  # another configuration: never packed against

    other = tmp_path / "src-unlike"
    (other / "lib").mkdir(parents=True)
    (other / "lib" / "libtvm.so").write_bytes(random.Random(99).randbytes(SIZE))
    cache.put_deduplicated("b2", other, {}, series="full")
    assert (cache.path("b1") / "lib" / "libtvm.so").exists()  # a delta would not be smaller


def test_rebuilt_object_with_a_bad_hash_is_an_error(tmp_path):
    store = ObjectStore(tmp_path / "objects")
    (tmp_path / "a").write_bytes(library(0))
    (tmp_path / "b").write_bytes(library(1))
    old, new = store.add(tmp_path / "a"), store.add(tmp_path / "b")
    assert store.make_delta(old, new)
    store.full(old).unlink()
    assert store.materialize(old).read_bytes() == library(0)
    store.full(old).unlink()
    store.full(new).write_bytes(library(2))  # the base changed under the delta
    with pytest.raises(Exception, match=old[:12]):
        store.materialize(old)


def test_cache_command_lists_and_shrinks(tmp_path, capsys):
    import json

    from abwatch.service.cli.main import main

    config = tmp_path / "c.toml"
    config.write_text(f'cache_dir = "{tmp_path / "cache"}"\n[repo]\nurl = "."\n[build]\ncommand = ["true"]\n'
                      '[[workloads]]\nname = "w"\ncommand = ["true"]\n')
    cache = ArtifactCache(tmp_path / "cache" / "artifacts")
    put_build(cache, tmp_path, "k1", 0)
    put_build(cache, tmp_path, "k2", 1)
    assert main(["cache", "--config", str(config), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["key"], e["files"], e["packed_files"]) for e in listed["entries"]] == [("k1", 2, 1), ("k2", 2, 0)]
    assert listed["bytes"] == cache.size_bytes()
    # one byte less than now: the least recently used entry (k1, packed) goes, k2 stays
    assert main(["cache", "--config", str(config), "--limit-gb", str((listed["bytes"] - 1) / 2**30), "--json"]) == 0
    assert [e["key"] for e in json.loads(capsys.readouterr().out)["entries"]] == ["k2"]


def test_rebuilding_through_a_chain_leaves_the_chain_packed(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    for version in range(4):
        put_build(cache, tmp_path, f"k{version}", version)
    middle = sha256_file_of(library(1), tmp_path)
    assert cache.objects.chain_length(middle) == 2
    cache.get("k0")  # rebuilt through k1's and k2's deltas
    assert not cache.objects.full(middle).exists() and cache.objects.chain_length(middle) == 2
