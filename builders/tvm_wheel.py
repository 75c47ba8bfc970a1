"""The ``tvm-wheel`` builder: a released apache-tvm wheel in a venv of its own.

Refs are release versions (``0.26.0``, ``0.27.0.post1``). Each version needs the
apache-tvm-ffi release it was built against: a newer tvm-ffi breaks older TVM at import
(0.25 fails with ``undefined symbol tvm::ffi::json::Stringify`` on the newest one), so
the pairs are pinned in :data:`FFI_PINS`. The venv is built in place inside the artifact
cache (a venv records its own path, so it is moved, never copied).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import time
from pathlib import Path

from abwatch.core.commit_info import CommitInfo
from abwatch.builders.builder import Artifact, Builder, BuildFailed, section
from abwatch.builders.cache import ArtifactCache
from abwatch.builders.procs import child_env, cut_log, run_process, status
from abwatch.builders.repo import RepoError
from abwatch.builders.safe_copy import confine, venv_interpreter
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import ARTIFACT_INFO, BuildSettings, TvmWheelBuildConfig
from abwatch.builders.wheelhouse import download, install_options, wheelhouse

# apache-tvm release -> the apache-tvm-ffi release it works with (each pair checked here:
# it installs, imports and compiles a kernel).
FFI_PINS: dict[str, str] = {
    "0.25.0": "0.1.12",
    "0.25.0.post1": "0.1.12",
    "0.26.0": "0.1.13.post2",
    "0.27.0": "0.1.14.post0",
    "0.27.0.post1": "0.1.14.post0",
}
# What the harness worker and the RPC tracker/server need beside TVM itself.
RUNTIME_PACKAGES = ("numpy", "tornado", "psutil", "cloudpickle")
LOG_LIMIT = 200_000


class TvmWheelBuilder(Builder):
    """Installs ``apache-tvm==<ref>`` with its pinned tvm-ffi into a cached venv."""

    kind = "tvm-wheel"
    repository_url = "pypi:apache-tvm"

    def __init__(self, config: BuildSettings) -> None:
        self.config: TvmWheelBuildConfig = section(config, TvmWheelBuildConfig)
        self.cache = ArtifactCache(config.cache_dir / "artifacts")
        self.cache_dir = config.cache_dir
        self.limits = config.cache

    def resolve(self, ref: str) -> CommitInfo:
        if ref not in FFI_PINS:
            known = ", ".join(FFI_PINS)
            raise RepoError(f"unknown apache-tvm version {ref!r} (tvm-wheel knows: {known})")
        return CommitInfo(sha=ref, summary=f"apache-tvm {ref} (tvm-ffi {FFI_PINS[ref]})",
                          author="PyPI", committed_at=None)

    def cache_key(self, sha: str) -> str:
        toolchain = f"{sys.version_info[:2]}-{platform.machine()}-{platform.system()}"
        digest = hashlib.sha256(f"{sha}\0{FFI_PINS.get(sha)}\0{self.config_hash()}\0{toolchain}".encode())
        return f"tvm-{sha}-{digest.hexdigest()[:12]}"

    def produce(self, sha: str, key: str) -> Artifact:
        self.resolve(sha)
        staging = self.cache.staging(key)
        start = time.monotonic()
        try:
            log = self._install(sha, staging)
        except BuildFailed:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        # built in place, never copied: what pip left linking out of the venv goes (builders.safe_copy)
        log += "".join(confine(staging, allow_link=venv_interpreter))
        info = {"python": "bin/python", "tvm_version": sha, "tvm_ffi_version": FFI_PINS[sha]}
        (staging / ARTIFACT_INFO).write_text(json.dumps(info, sort_keys=True))
        duration = time.monotonic() - start
        path = self.cache.adopt(key, staging, {"sha": sha, "builder": self.kind})
        return Artifact(key=key, path=path, cached=False, log=log, duration_s=duration)

    def binary_files(self, path: Path) -> list[Path]:
        # the wheel's TVM libraries (libtvm.so, or libtvm_compiler.so and libtvm_runtime.so)
        return list(path.glob("lib/python*/site-packages/tvm/**/libtvm*.so"))

    def _install(self, version: str, venv) -> str:
        # the build has no network: its packages are downloaded first, by abwatch (builders.wheelhouse)
        requirements = [f"apache-tvm=={version}", f"apache-tvm-ffi=={FFI_PINS[version]}",
                        *RUNTIME_PACKAGES, *self.config.packages]
        wheels = wheelhouse(self.cache_dir)
        deadline = time.monotonic() + self.config.timeout_s
        log = download(requirements, wheels, child_env(self.config.env), self.config.timeout_s,
                       f"installing apache-tvm {version}")
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
             "--no-input", *install_options(wheels), *requirements],
        ]
        for argv in steps:
            try:
                proc = run_process(argv, cwd=None, env=child_env(self.config.env), merge_stderr=True,
                                   sandbox=Sandbox(writable=(venv,), build=True),
                                   timeout_s=max(1.0, deadline - time.monotonic()))
            except OSError as exc:
                raise BuildFailed(f"installing apache-tvm {version}: cannot run {argv[0]}: {exc.strerror}",
                                  log, 0.0) from None
            log += f"$ {' '.join(argv)}\n{cut_log(proc.stdout, LOG_LIMIT, proc.cut)}"
            if proc.timed_out:
                raise BuildFailed(f"installing apache-tvm {version} timed out", log[-LOG_LIMIT:],
                                  self.config.timeout_s)
            if proc.returncode != 0:  # checked for a full disk while the half-made venv still fills it
                raise self.failed(f"installing apache-tvm {version} failed ({status(proc)})",
                                  log[-LOG_LIMIT:], time.monotonic() - deadline + self.config.timeout_s)
        return log[-LOG_LIMIT:]
