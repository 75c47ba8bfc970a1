"""The command builder and the artifact cache: clean checkouts, markers, locks, failures."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from abwatch.builders import BuildFailed, CommandBuilder
from abwatch.builders.cache import MARKER
from abwatch.service.config import CommandBuildConfig, CommandWorkloadConfig, Config, RepoConfig
from abwatch.builders.repo import RepoError, RepoMirror


def builder_for(repo_url: str, cache_dir: Path, command=("sh", "build.sh"), artifacts="out") -> CommandBuilder:
    config = Config(repo=RepoConfig(url=repo_url), cache_dir=cache_dir,
                    build=CommandBuildConfig(command=list(command), artifacts=artifacts),
                    workloads=[CommandWorkloadConfig(name="w", command=["true"])])
    return CommandBuilder(config)


def test_build_once_then_reuse(bench_repo, tmp_path):
    builder = builder_for(str(bench_repo), tmp_path)
    sha = builder.repo.resolve("base").sha
    first = builder.build(sha)
    assert not first.cached and (first.path / "bench").is_file() and (first.path / MARKER).is_file()
    assert "built out/bench" in first.log
    second = builder.build(sha)
    assert second.cached and second.path == first.path and second.key == first.key
    # the checkout was removed and unregistered: no worktree is left behind
    assert builder.repo.repo.git.worktree("list").count("\n") == 0


def test_incomplete_entry_is_never_used(bench_repo, tmp_path):
    builder = builder_for(str(bench_repo), tmp_path)
    sha = builder.repo.resolve("base").sha
    half = builder.cache.path(builder.cache_key(sha))
    half.mkdir(parents=True)
    (half / "bench").write_text("half-written")
    assert builder.cache.get(builder.cache_key(sha)) is None
    artifact = builder.build(sha)
    assert not artifact.cached
    assert (artifact.path / "bench").read_bytes()[:4] == b"\x7fELF"


def test_key_depends_on_commit_and_build_config(bench_repo, tmp_path):
    a = builder_for(str(bench_repo), tmp_path)
    b = builder_for(str(bench_repo), tmp_path, command=("sh", "-c", "sh build.sh"))
    base, noop = a.repo.resolve("base").sha, a.repo.resolve("noop").sha
    assert len({a.cache_key(base), a.cache_key(noop), b.cache_key(base)}) == 3


def test_failed_build_raises_with_log_and_caches_nothing(bench_repo, tmp_path):
    builder = builder_for(str(bench_repo), tmp_path)
    sha = builder.repo.resolve("broken").sha
    with pytest.raises(BuildFailed) as info:
        builder.build(sha)
    assert "exited with status" in str(info.value) and sha[:12] in str(info.value)
    assert "error" in info.value.log
    assert builder.cache.get(builder.cache_key(sha)) is None


def test_missing_artifact_directory_is_a_build_failure(bench_repo, tmp_path):
    builder = builder_for(str(bench_repo), tmp_path, artifacts="nowhere")
    with pytest.raises(BuildFailed, match="produced no directory 'nowhere'"):
        builder.build(builder.repo.resolve("base").sha)


def _slow_build(repo_url: str, cache_dir: str, sha: str, queue) -> None:
    builder = builder_for(repo_url, Path(cache_dir), command=("sh", "-c", "sleep 1; sh build.sh"))
    artifact = builder.build(sha)
    queue.put((artifact.cached, time.monotonic()))


def test_concurrent_builders_of_one_key_build_once(bench_repo, tmp_path):
    _ = builder_for(str(bench_repo), tmp_path).repo.repo  # clone the mirror once, up front
    sha = builder_for(str(bench_repo), tmp_path).repo.resolve("base").sha
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_slow_build, args=(str(bench_repo), str(tmp_path), sha, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = sorted(queue.get(timeout=5) for _ in procs)
    assert [cached for cached, _ in results] == [False, True]


def test_unknown_ref_and_bad_repository(bench_repo, tmp_path):
    mirror = RepoMirror(str(bench_repo), tmp_path)
    with pytest.raises(RepoError, match="unknown ref 'v9.9'"):
        mirror.resolve("v9.9")
    with pytest.raises(RepoError, match=r"unknown ref 'slowr' in repository .*; nearest: slower"):
        mirror.resolve("slowr")  # a typo: the tags and branches nearest to it
    with pytest.raises(RepoError, match="cannot clone repository"):
        RepoMirror(str(tmp_path / "no-repo"), tmp_path).resolve("main")


def test_mirror_sees_new_commits_after_fetch(tmp_path):
    from abwatch.service.cli.demo import Step, make_demo_repo

    make_demo_repo(tmp_path / "src", (Step("one", "one"),))
    mirror = RepoMirror(str(tmp_path / "src"), tmp_path / "cache")
    assert mirror.resolve("main").sha == mirror.resolve("one").sha
    make_demo_repo(tmp_path / "src", (Step("one", "one"), Step("two", "two", work=5)))
    with pytest.raises(RepoError):
        mirror.resolve("two")
    mirror.fetch()
    assert mirror.resolve("main").sha == mirror.resolve("two").sha
