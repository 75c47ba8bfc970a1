"""The ``command`` builder: run a command in a clean checkout, keep a directory of it."""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
from pathlib import Path

from abwatch.core.commit_info import CommitInfo
from abwatch.builders.builder import Artifact, Builder, BuildFailed, InfraFailure, missing_tool, repo_url, section
from abwatch.builders.cache import ArtifactCache
from abwatch.builders.procs import child_env, cut_log, ending, run_process
from abwatch.builders.repo import RepoMirror, remove_stale_checkouts
from abwatch.builders.safe_copy import UnsafeArtifact, inside
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import BuildSettings, CommandBuildConfig

LOG_LIMIT = 200_000  # characters of build output kept in the database


class CommandBuilder(Builder):
    """Builds a commit by running ``build.command`` in a fresh worktree of it."""

    kind = "command"
    shareable = True  # a directory the build command made in its checkout: nothing of the host in it

    def __init__(self, config: BuildSettings) -> None:
        self.config: CommandBuildConfig = section(config, CommandBuildConfig)
        self.repo = RepoMirror(repo_url(config), config.cache_dir)
        self.cache = ArtifactCache(config.cache_dir / "artifacts")
        self.limits = config.cache
        self.checkouts = config.cache_dir / "checkouts"
        self.repository_url = self.repo.display_url
        self._fetched = False

    def resolve(self, ref: str) -> CommitInfo:
        if not self._fetched:  # bring the mirror up to date once per builder
            self.repo.fetch_for(ref)
            self._fetched = True
        return self.repo.resolve(ref)

    def cache_key(self, sha: str) -> str:
        # The toolchain part: what the build command runs on (machine and OS).
        toolchain = f"{platform.machine()}-{platform.system()}-{platform.release()}"
        digest = hashlib.sha256(f"{sha}\0{self.config_hash()}\0{toolchain}".encode()).hexdigest()
        return f"{sha[:12]}-{digest[:16]}"

    def produce(self, sha: str, key: str) -> Artifact:
        # Checkouts live under the cache, named by our pid, so a killed build's is found and removed.
        remove_stale_checkouts(self.checkouts)
        self.checkouts.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-", dir=self.checkouts) as tmp:
            os.chmod(tmp, 0o711)  # the build, as the sandbox's user, works in the checkout inside
            checkout = Path(tmp) / "src"
            with self.repo.worktree(sha, checkout):
                log, duration = self._run(sha, checkout)
                said: list[str] = []
                try:  # the build's outputs, never what they link to (builders.safe_copy)
                    artifacts = inside(checkout, self.config.artifacts)
                    if not artifacts.is_dir():
                        raise self.failed(f"build of {sha[:12]} produced no directory {self.config.artifacts!r}",
                                          log, duration)
                    path = self.cache.put(key, artifacts, {"sha": sha, "builder": self.kind}, said=said)
                except UnsafeArtifact as exc:
                    raise BuildFailed(f"build of {sha[:12]}: artifacts {exc}", log, duration) from None
                log += "".join(said)
        return Artifact(key=key, path=path, cached=False, log=log, duration_s=duration)

    def binary_files(self, path: Path) -> list[Path]:
        # a project's artifacts are whatever it makes: which of them are its binaries, the config says
        return [f for pattern in self.config.binary_size for f in path.glob(pattern)]

    def _run(self, sha: str, checkout: Path) -> tuple[str, float]:
        env = child_env(self.config.env, {"ABWATCH_COMMIT": sha})
        try:
            # An argument list, never a shell string: config values are not parsed by a shell.
            # sandboxed: the checkout is all it may write; no network ([sandbox] build_network)
            proc = run_process(self.config.command, cwd=checkout, env=env, timeout_s=self.config.timeout_s,
                               merge_stderr=True, sandbox=Sandbox(writable=(checkout,), build=True))
        except OSError as exc:
            if missing_tool(self.config.command[0], exc):  # the machine lacks a tool the config names
                raise InfraFailure(f"build of {sha[:12]}: the build tool {self.config.command[0]!r} is not "
                                   f"installed on this machine ({exc.strerror}); not the commit's failure") from None
            raise BuildFailed(
                f"build of {sha[:12]} could not start {self.config.command[0]!r}: {exc.strerror}",
                str(exc), 0.0,
            ) from None
        log = cut_log(proc.stdout, LOG_LIMIT, proc.cut)
        if proc.timed_out:
            raise BuildFailed(f"build of {sha[:12]} timed out after {self.config.timeout_s:g}s",
                              log, proc.wall_s)
        if proc.returncode != 0:  # checked for a full disk while the checkout still fills it
            raise self.failed(f"build of {sha[:12]} {ending(proc)}", log, proc.wall_s)
        return log, proc.wall_s
