"""The ``tvm-source`` builder: TVM built from source at a commit, incrementally.

Each build configuration keeps one persistent workspace, ``{cache_dir}/tvm-source/<config>/``,
with a source checkout (``src/``) and a build directory (``build/``) that move from commit to
commit, so Ninja recompiles only what a commit changed; ccache (``CCACHE_BASEDIR`` set to the
workspace) shares object files across workspaces. The result — the libraries as ``lib/`` and
the ``python/`` package — goes into the artifact cache with every file stored once by content,
so neighbouring commits share their unchanged libraries. The artifact runs with
``PYTHONPATH=<artifact>/python TVM_LIBRARY_PATH=<artifact>/lib`` in a venv holding the
apache-tvm-ffi release that matches the ``3rdparty/tvm-ffi`` submodule's tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from abwatch.builders.base import Artifact, Builder, BuildFailed, repo_url, section
from abwatch.builders.cache import ArtifactCache, flocked
from abwatch.builders.procs import child_env, run_process
from abwatch.builders.repo import RepoMirror
from abwatch.builders.spec import ARTIFACT_INFO, BuildSettings, CommitInfo, TvmSourceBuildConfig

LOG_LIMIT = 400_000
RUNTIME_TARGET = "tvm_runtime"


def tool(name: str) -> str | None:
    """A build tool from abwatch's own environment (pip's cmake, ninja, ccache) or the PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


class TvmSourceBuilder(Builder):
    """Checks out a commit (with submodules) and builds it with CMake + Ninja."""

    kind = "tvm-source"

    def __init__(self, config: BuildSettings) -> None:
        self.config: TvmSourceBuildConfig = section(config, TvmSourceBuildConfig)
        self.repo = RepoMirror(repo_url(config), config.cache_dir)
        self.repository_url = self.repo.display_url
        self.cache = ArtifactCache(config.cache_dir / "artifacts")
        self.workspace = config.cache_dir / "tvm-source" / self.config.workspace_hash()
        self.ccache_dir = config.cache_dir / "ccache"
        self._fetched = False
        self._toolchain: str | None = None

    def resolve(self, ref: str) -> CommitInfo:
        if not self._fetched:  # bring the mirror up to date once per builder
            self.repo.fetch_for(ref)
            self._fetched = True
        return self.repo.resolve(ref)

    def toolchain(self) -> str:
        """CMake, compiler and (with USE_LLVM) LLVM versions: part of every cache key."""
        if self._toolchain is None:
            parts = []
            use_llvm = self.config.cmake.get("USE_LLVM", "OFF")
            # USE_LLVM is ON or the path of an llvm-config; either way its version is part of the key
            llvm_config = use_llvm if use_llvm.endswith("llvm-config") else "llvm-config"
            for argv in ([tool("cmake") or "cmake", "--version"], [shutil.which("c++") or "c++", "--version"],
                         *([[llvm_config, "--version"]] if use_llvm.upper() != "OFF" else [])):
                try:
                    out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
                    parts.append(out.splitlines()[0] if out else f"{argv[0]}: ?")
                except OSError:
                    parts.append(f"{argv[0]}: missing")
            self._toolchain = " | ".join(parts)
        return self._toolchain

    def cache_key(self, sha: str) -> str:
        digest = hashlib.sha256(f"{sha}\0{self.config_hash()}\0{self.toolchain()}".encode()).hexdigest()
        return f"src-{sha[:12]}-{digest[:12]}"

    def produce(self, sha: str, key: str) -> Artifact:
        with self._workspace_lock():
            start = time.monotonic()
            log: list[str] = []
            try:
                metrics = self._checkout_and_build(sha, log)
                path = self._store(key, sha, log)
            except BuildFailed as exc:
                raise BuildFailed(str(exc), "".join(log)[-LOG_LIMIT:], time.monotonic() - start) from None
        self.cache.evict(int(self.config.cache_limit_gb * 2**30), keep={key})
        metrics["duration_s"] = time.monotonic() - start
        return Artifact(key=key, path=path, cached=False, log="".join(log)[-LOG_LIMIT:],
                        duration_s=metrics["duration_s"], metrics=metrics)

    def _workspace_lock(self):
        self.workspace.mkdir(parents=True, exist_ok=True)
        return flocked(self.workspace / "workspace.lock")

    def _run(self, argv: list[str], log: list[str], what: str, cwd: Path | None = None,
             env: dict | None = None, deadline: float | None = None) -> str:
        log.append(f"$ {' '.join(argv)}\n")
        timeout = max(1.0, (deadline or time.monotonic() + self.config.timeout_s) - time.monotonic())
        try:
            proc = run_process(argv, cwd=cwd, env=env if env is not None else child_env(self.config.env),
                               timeout_s=timeout, merge_stderr=True)
        except OSError as exc:
            raise BuildFailed(f"{what}: cannot run {argv[0]}: {exc.strerror}", "", 0.0) from None
        log.append(proc.stdout)
        if proc.timed_out:
            raise BuildFailed(f"{what} timed out", "", 0.0)
        if proc.returncode != 0:
            raise BuildFailed(f"{what} failed (status {proc.returncode})", "", 0.0)
        return proc.stdout

    def _git(self) -> list[str]:
        argv = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false"]
        for prefix, mirror in self.config.submodule_rewrites.items():
            argv += ["-c", f"url.{mirror}.insteadOf={prefix}"]
        return argv

    def _checkout_and_build(self, sha: str, log: list[str]) -> dict:
        src, build = self.workspace / "src", self.workspace / "build"
        deadline = time.monotonic() + self.config.timeout_s
        git = self._git()
        mirror = self.repo.repo.git_dir  # clones the mirror on first use
        if not (src / ".git").exists():
            self._run(git + ["clone", "--no-checkout", str(mirror), str(src)], log, "clone", deadline=deadline)
        self._run(git + ["-C", str(src), "fetch", "--quiet", "origin"], log, "fetch", deadline=deadline)
        # git keeps the mtimes of files a checkout does not change: Ninja rebuilds only the rest
        self._run(git + ["-C", str(src), "checkout", "--force", "--detach", sha], log, f"checkout of {sha[:12]}",
                  deadline=deadline)
        self._run(git + ["-C", str(src), "submodule", "sync", "--recursive"], log, "submodule sync", deadline=deadline)
        if self.config.submodules is None:
            self._run(git + ["-C", str(src), "submodule", "update", "--init", "--recursive", "--force"], log,
                      "submodule update", deadline=deadline)
        else:
            # Only the listed paths, parents first (a CPU build of TVM needs just 3rdparty/tvm-ffi
            # and its dlpack); each is updated from the repository that contains it.
            for path in self.config.submodules:
                parent = next((p for p in Path(path).parents if (src / p / ".git").exists()), Path("."))
                self._run(git + ["-C", str(src / parent), "submodule", "update", "--init", "--force", "--",
                                 str(Path(path).relative_to(parent))], log, f"submodule update {path}",
                          deadline=deadline)
        build.mkdir(exist_ok=True)
        lines = [f"set({name} {_cmake_value(value)})\n" for name, value in sorted(self.config.cmake.items())]
        config_cmake = "".join(lines) + "set(CMAKE_BUILD_TYPE Release)\n"
        if not (build / "config.cmake").exists() or (build / "config.cmake").read_text() != config_cmake:
            (build / "config.cmake").write_text(config_cmake)  # rewritten only on change: no needless reconfigure
        cmake, ninja, ccache = tool("cmake"), tool("ninja"), tool("ccache")
        if cmake is None or ninja is None:
            raise BuildFailed("tvm-source needs cmake and ninja (pip install 'abwatch[source]')", "", 0.0)
        env = child_env(self.config.env, {"CCACHE_BASEDIR": str(self.workspace.parent),
                                          "CCACHE_DIR": str(self.ccache_dir), "CCACHE_NOHASHDIR": "1"})
        incremental = (build / "build.ninja").exists()
        if not incremental:
            launcher = [f"-DCMAKE_C_COMPILER_LAUNCHER={ccache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}"] if ccache else []
            self._run([cmake, "-G", "Ninja", "-S", str(src), "-B", str(build), f"-DCMAKE_MAKE_PROGRAM={ninja}",
                       "-DCMAKE_BUILD_TYPE=Release", *launcher], log, "cmake configure", env=env, deadline=deadline)
        if ccache:
            self._run([ccache, "--zero-stats"], log, "ccache", env=env)
        targets = self.config.targets or ([RUNTIME_TARGET] if self.config.runtime_only else [])
        jobs = str(self.config.jobs or os.cpu_count() or 1)
        started = time.monotonic()
        out = self._run([cmake, "--build", str(build), "--parallel", jobs,
                         *(["--target", *targets] if targets else [])], log, f"build of {sha[:12]}",
                        env=env, deadline=deadline)
        metrics = {"incremental": incremental, "compile_s": time.monotonic() - started,
                   "steps": len(re.findall(r"^\[\d+/\d+\]", out, flags=re.M)), "jobs": int(jobs),
                   "toolchain": self.toolchain()}
        if ccache:
            metrics.update(_ccache_stats(self._run([ccache, "--print-stats"], [], "ccache", env=env)))
        return metrics

    def _store(self, key: str, sha: str, log: list[str]) -> Path:
        src, build = self.workspace / "src", self.workspace / "build"
        with tempfile.TemporaryDirectory(prefix="abwatch-src-artifact-") as tmp:
            staging = Path(tmp) / "a"
            (staging / "lib").mkdir(parents=True)
            libraries = sorted({p for pattern in self.config.libraries for p in build.glob(pattern) if p.is_file()})
            if not libraries:
                raise BuildFailed(f"build of {sha[:12]} produced no library matching {self.config.libraries}", "", 0.0)
            for library in libraries:
                shutil.copy2(library, staging / "lib" / library.name)
            if (src / self.config.python_dir).is_dir():
                shutil.copytree(src / self.config.python_dir, staging / "python", symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info"))
            python = self._venv(self._ffi_version(src), log)
            info = {"python": python, "env_paths": {"PYTHONPATH": "python", "TVM_LIBRARY_PATH": "lib"},
                    "sha": sha, "libraries": [p.name for p in libraries]}
            (staging / ARTIFACT_INFO).write_text(json.dumps(info, sort_keys=True))
            # one series per workspace: older builds of this configuration are packed against this one
            series = self.config.workspace_hash() if self.config.pack_deltas else None
            return self.cache.put_deduplicated(key, staging, {"sha": sha, "builder": self.kind}, series=series)

    @staticmethod
    def _ffi_version(src: Path) -> str | None:
        ffi = src / "3rdparty" / "tvm-ffi"
        if not (ffi / ".git").exists():
            return None
        out = subprocess.run(["git", "-C", str(ffi), "describe", "--tags", "--abbrev=0"],
                             capture_output=True, text=True).stdout.strip()
        return out.lstrip("v") or None

    def _venv(self, ffi_version: str | None, log: list[str]) -> str:
        """The shared venv with ``python_packages`` (``{ffi_version}`` filled in); its python path."""
        packages = []
        for requirement in self.config.python_packages:
            if "{ffi_version}" in requirement:
                if ffi_version is None:
                    log.append(f"note: no 3rdparty/tvm-ffi tag; skipping {requirement}\n")
                    continue
                requirement = requirement.replace("{ffi_version}", ffi_version)
            packages.append(requirement)
        digest = hashlib.sha256(json.dumps(packages).encode()).hexdigest()[:12]
        venv = self.workspace.parent / f"venv-{digest}"
        if not (venv / ".abwatch-complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            self._run([sys.executable, "-m", "venv", str(venv)], log, "venv")
            if packages:
                self._run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                           "--no-input", *packages], log, "pip install")
            (venv / ".abwatch-complete").write_text(json.dumps(packages))
        return str(venv / "bin" / "python")


def _cmake_value(value: str) -> str:
    """``value`` as one CMake argument: quoted when it has spaces or semicolons (else it splits)."""
    if value and not re.search(r'[\s;"\\()#$]', value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _ccache_stats(text: str) -> dict:
    """Hits, misses and hit rate from ``ccache --print-stats`` (tab-separated)."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            values[name.strip()] = int(value)
    hits = values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0)
    misses = values.get("cache_miss", 0)
    return {"ccache_hits": hits, "ccache_misses": misses,
            "ccache_hit_rate": hits / (hits + misses) if hits + misses else None}
