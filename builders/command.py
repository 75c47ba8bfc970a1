"""The ``command`` builder: run a command in a clean checkout, keep a directory of it."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from builders.base import Artifact, Builder, BuildFailed
from builders.cache import ArtifactCache
from service.config import Config
from service.repo import CommitInfo, RepoMirror

LOG_LIMIT = 200_000  # characters of build output kept in the database


class CommandBuilder(Builder):
    """Builds a commit by running ``build.command`` in a fresh worktree of it."""

    kind = "command"

    def __init__(self, config: Config) -> None:
        self.config = config.build
        self.repo = RepoMirror(config.repo.url, config.cache_dir)
        self.cache = ArtifactCache(config.cache_dir / "artifacts")
        self.repository_url = config.repo.url
        self._fetched = False

    def resolve(self, ref: str) -> CommitInfo:
        if not self._fetched:  # bring the mirror up to date once per builder
            self.repo.fetch()
            self._fetched = True
        return self.repo.resolve(ref)

    def config_hash(self) -> str:
        return self.config.config_hash()

    def cache_key(self, sha: str) -> str:
        # The toolchain part: what the build command runs on (machine and OS).
        toolchain = f"{platform.machine()}-{platform.system()}-{platform.release()}"
        digest = hashlib.sha256(f"{sha}\0{self.config_hash()}\0{toolchain}".encode()).hexdigest()
        return f"{sha[:12]}-{digest[:16]}"

    def produce(self, sha: str, key: str) -> Artifact:
        with tempfile.TemporaryDirectory(prefix="abwatch-build-") as tmp:
            checkout = Path(tmp) / "src"
            with self.repo.worktree(sha, checkout):
                log, duration = self._run(sha, checkout)
                artifacts = checkout / self.config.artifacts
                if not artifacts.is_dir():
                    raise BuildFailed(f"build of {sha[:12]} produced no directory {self.config.artifacts!r}",
                                      log, duration)
                path = self.cache.put(key, artifacts, {"sha": sha, "builder": self.kind})
        return Artifact(key=key, path=path, cached=False, log=log, duration_s=duration)

    def _run(self, sha: str, checkout: Path) -> tuple[str, float]:
        env = dict(os.environ, **self.config.env, ABWATCH_COMMIT=sha)
        start = time.monotonic()
        try:
            # An argument list, never a shell string: config values are not parsed by a shell.
            proc = subprocess.run(
                self.config.command,
                cwd=checkout,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self.config.timeout_s,
                text=True,
                errors="replace",
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            if isinstance(out, bytes):
                out = out.decode(errors="replace")
            raise BuildFailed(
                f"build of {sha[:12]} timed out after {self.config.timeout_s:g}s",
                out[-LOG_LIMIT:],
                time.monotonic() - start,
            ) from None
        except OSError as exc:
            raise BuildFailed(
                f"build of {sha[:12]} could not start {self.config.command[0]!r}: {exc.strerror}",
                str(exc),
                time.monotonic() - start,
            ) from None
        duration = time.monotonic() - start
        log = proc.stdout[-LOG_LIMIT:]
        if proc.returncode != 0:
            raise BuildFailed(f"build of {sha[:12]} exited with status {proc.returncode}", log, duration)
        return log, duration
