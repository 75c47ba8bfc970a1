"""The ``tvm-source`` builder: TVM built from source at a commit, incrementally.

Each build configuration keeps one persistent workspace, ``{cache_dir}/tvm-source/<config>/``,
with a source checkout (``src/``) and a build directory (``build/``) that move from commit to
commit, so Ninja recompiles only what a commit changed; ccache (``CCACHE_BASEDIR`` set to the
workspace) shares object files across workspaces, and with ``ccache_remote`` across build hosts
(``builders.compiler_cache``). The result — the libraries as ``lib/`` and
the ``python/`` package — goes into the artifact cache with every file stored once by content,
so neighbouring commits share their unchanged libraries. The artifact runs with
``PYTHONPATH=<artifact>/python TVM_LIBRARY_PATH=<artifact>/lib`` in ``<artifact>/venv``, a copy
of the workspace's shared venv made relocatable (``builders.venv_copy``), holding the
apache-tvm-ffi release of the ``3rdparty/tvm-ffi`` submodule's tag, or, when the submodule sits
between tags, that package built from the submodule's own source (``builders.tvm_ffi``); after
each build the build's Python imports TVM and compiles a small module (``check_import``).

A failed step names itself (checkout, submodules, configure, compile, tvm-ffi package,
post-build check) with the lines of its output that say why (``failure_lines``).
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

from abwatch.core.file_lock import flocked
from abwatch.core.commit_info import CommitInfo
from abwatch.builders.builder import Artifact, Builder, BuildFailed, InfraFailure, SubmodulePin, failure_lines, \
    missing_tool, repo_url, section
from abwatch.builders.build_tools import BuildTools, check_build_tools, tool
from abwatch.builders.cache import ArtifactCache
from abwatch.builders.compiler_cache import STATS_LOG, CompilerCache, parse_stats
from abwatch.builders.environment import ArtifactInfoError, artifact_info, build_environment, build_python, \
    missing_libraries
from abwatch.builders.nofollow import read_inside, write_inside
from abwatch.builders.procs import ProcessResult, child_env, cut_log, run_process, status
from abwatch.builders.repo import RepoMirror
from abwatch.builders.safe_copy import UnsafeArtifact, copy_file, copy_tree, inside, resolved_inside, \
    venv_interpreter
from abwatch.builders.sandbox import Sandbox
from abwatch.builders.spec import ARTIFACT_INFO, BuildSettings, TvmSourceBuildConfig
from abwatch.core.device_backends import DEVICE_BACKENDS
from abwatch.builders.tvm_ffi import FfiState, Step, ffi_state, install_package, package_settings, \
    update_submodules
from abwatch.builders.venv_copy import copy_venv, interpreter_problem
from abwatch.builders.wheelhouse import download, install_options, local_needs, wheelhouse

LOG_LIMIT = 400_000
RUNTIME_TARGET = "tvm_runtime"
VENV_DIR = "venv"  # the build's venv, inside the artifact
RPATH_ORIGIN = "CMAKE_BUILD_RPATH_USE_ORIGIN:BOOL=ON"


class TvmSourceBuilder(Builder):
    """Checks out a commit (with submodules) and builds it with CMake + Ninja."""

    kind = "tvm-source"
    shareable = True  # the venv travels inside the artifact (builders.venv_copy); see portable()

    def __init__(self, config: BuildSettings) -> None:
        self.config: TvmSourceBuildConfig = section(config, TvmSourceBuildConfig)
        self.repo = RepoMirror(repo_url(config), config.cache_dir)
        self.repository_url = self.repo.display_url
        self.cache = ArtifactCache(config.cache_dir / "artifacts")
        self.cache_dir = config.cache_dir
        self.limits = config.cache
        # unmerged code (TvmSourceBuildConfig.for_untrusted) builds apart: it may write only its own
        # workspaces and compiler cache, never those trusted builds reuse
        apart = "-untrusted" if self.config.untrusted else ""
        self.workspace = config.cache_dir / f"tvm-source{apart}" / self.config.workspace_hash()
        self.ccache_dir = config.cache_dir / f"ccache{apart}"
        remote = None if self.config.untrusted else self.config.ccache_remote  # never the shared cache for untrusted code
        self.compiler_cache = CompilerCache(self.ccache_dir, self.workspace.parent, remote,
                                            self.config.ccache_remote_password_env)
        self._fetched = False
        # what its steps may write: the workspaces, their venvs and ccache, and the local package
        # directories the config names (pip builds them in place)
        local = tuple(p for p in self.config.python_packages if "{" not in p and Path(p).is_dir())
        self._sandbox = Sandbox(writable=(self.workspace.parent, self.ccache_dir, *local), build=True)
        self._toolchain: str | None = None
        self._tools: BuildTools | None = None  # checked at the first resolve or build
        self._pins: dict[str, SubmodulePin] = {}  # commits built with a submodule moved (pin_submodule)

    def resolve(self, ref: str) -> CommitInfo:
        if not self._fetched:  # bring the mirror up to date once per builder
            # the tools first: one too old is refused now, not after the fetch and an hour's compile
            self._tools = check_build_tools()
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

    def cache_limit_bytes(self) -> int | None:
        # build.cache_limit_gb (this builder's own, older key) and [cache] max_gb: the smaller
        own = int(self.config.cache_limit_gb * 2**30)
        general = super().cache_limit_bytes()
        return own if general is None else min(own, general)

    def scratch_dirs(self) -> list[Path]:
        return [*super().scratch_dirs(), self.workspace]

    def pin_submodule(self, sha: str, pin: SubmodulePin | None) -> None:
        """Build ``sha`` with ``pin.path`` checked out at ``pin.sha`` (a bisection into a bump);
        the path must be one of ``[build] submodules``, the ones the build checks out."""
        if pin is None:
            self._pins.pop(sha, None)
            return
        if pin.path not in (self.config.submodules or []):
            raise ValueError(f"cannot pin {pin.path}: not one of [build] submodules ({self.config.submodules})")
        self._pins[sha] = pin

    def submodule_pin(self, sha: str) -> SubmodulePin | None:
        return self._pins.get(sha)

    def cache_key(self, sha: str) -> str:
        pin = self._pins.get(sha)
        # a pinned submodule is another build of the same commit: its own key, entry and row
        moved = f"\0{pin.describe}" if pin else ""
        digest = hashlib.sha256(f"{sha}\0{self.config_hash()}\0{self.toolchain()}{moved}".encode()).hexdigest()
        return f"src-{sha[:12]}-{pin.sha[:8] + '-' if pin else ''}{digest[:12]}"

    def produce(self, sha: str, key: str) -> Artifact:
        with self._workspace_lock():
            start = time.monotonic()
            log: list[str] = []
            try:
                try:
                    metrics = self._checkout_and_build(sha, log)
                finally:  # the shared compiler cache gets what the compiles added, whatever happened after
                    uploaded = self.compiler_cache.finish(log)
                metrics.update(uploaded)
                path = self._store(key, sha, log)
            except BuildFailed as exc:
                raise BuildFailed(str(exc), cut_log("".join(log), LOG_LIMIT), time.monotonic() - start) from None
        metrics["duration_s"] = time.monotonic() - start
        return Artifact(key=key, path=path, cached=False, log=cut_log("".join(log), LOG_LIMIT),
                        duration_s=metrics["duration_s"], metrics=metrics)

    def binary_files(self, path: Path) -> list[Path]:
        # the libraries the build kept (``libraries``): TVM's, and tvm-ffi's where built with it
        return list(path.glob("lib/*.so"))

    def _workspace_lock(self):
        self.workspace.mkdir(parents=True, exist_ok=True)
        return flocked(self.workspace / "workspace.lock")

    def _run(self, argv: list[str], log: list[str], what: str, cwd: Path | None = None,
             env: dict | None = None, deadline: float | None = None) -> str:
        return self._run_process(argv, log, what, cwd=cwd, env=env, deadline=deadline).stdout

    def _run_process(self, argv: list[str], log: list[str], what: str, cwd: Path | None = None,
                     env: dict | None = None, deadline: float | None = None) -> ProcessResult:
        """Run one step of the build (its output into ``log``); a failure raises, naming ``what``."""
        log.append(f"$ {' '.join(argv)}\n")
        timeout = max(1.0, (deadline or time.monotonic() + self.config.timeout_s) - time.monotonic())
        try:
            proc = run_process(argv, cwd=cwd, env=env if env is not None else child_env(self.config.env),
                               timeout_s=timeout, merge_stderr=True, sandbox=self._sandbox)
        except OSError as exc:
            if missing_tool(argv[0], exc):  # cmake, ninja, git or a compiler the machine lacks
                raise InfraFailure(f"{what}: {argv[0]!r} is not installed on this machine ({exc.strerror}); "
                                   "not the commit's failure") from None
            raise BuildFailed(f"{what}: cannot run {argv[0]}: {exc.strerror}", "", 0.0) from None
        log.append(cut_log(proc.stdout, LOG_LIMIT, proc.cut))
        if proc.timed_out:
            raise BuildFailed(f"{what} timed out", "", 0.0)
        if proc.returncode != 0:
            why = " | ".join(failure_lines(proc.stdout)) or "it printed nothing"
            raise self.failed(f"{what} failed ({status(proc)}): {why}", "", 0.0)
        return proc

    def _step(self, log: list[str], deadline: float, env: dict | None = None) -> Step:
        """``_run`` as the one-step callable ``builders.tvm_ffi`` takes."""
        return lambda argv, what, cwd: self._run(argv, log, what, cwd=cwd, env=env, deadline=deadline)

    def _git(self) -> list[str]:
        argv = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false"]
        for prefix, mirror in self.config.submodule_rewrites.items():
            argv += ["-c", f"url.{mirror}.insteadOf={prefix}"]
        return argv

    def _checkout_and_build(self, sha: str, log: list[str]) -> dict:
        src, build = self.workspace / "src", self.workspace / "build"
        deadline = time.monotonic() + self.config.timeout_s
        self._checkout(sha, src, log, deadline)
        mine, relative = self._write_config(build, log)
        if self._tools is None:
            self._tools = check_build_tools()
        cmake, ninja, ccache = self._tools.cmake, self._tools.ninja, self._tools.ccache
        if ccache:
            self.compiler_cache.begin(log)
        env = self._ccache_env()
        incremental = (build / "build.ninja").exists()
        # the libraries find each other by $ORIGIN, not by the build directory's path: an artifact
        # runs on another host, and never loads a library of whatever commit the workspace holds
        # now (a workspace configured before this is configured again: its libraries relink)
        try:
            cached = read_inside(mine, f"{relative}/CMakeCache.txt", limit=2**24) or ""
        except OSError:
            cached = ""
        if not incremental or RPATH_ORIGIN not in cached:
            launcher = [f"-DCMAKE_C_COMPILER_LAUNCHER={ccache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ccache}"] if ccache else []
            self._run([cmake, "-G", "Ninja", "-S", str(src), "-B", str(build), f"-DCMAKE_MAKE_PROGRAM={ninja}",
                       "-DCMAKE_BUILD_TYPE=Release", f"-D{RPATH_ORIGIN}", *launcher], log, "configure", env=env,
                      deadline=deadline)
        # this build's own ccache counts: a stats log of its compiles (concurrent builds in other
        # workspaces keep theirs; the cache's lifetime counters are never zeroed)
        stats_log = self.workspace / STATS_LOG
        stats_log.unlink(missing_ok=True)
        targets = self.config.targets or ([RUNTIME_TARGET] if self.config.runtime_only else [])
        jobs = str(self.config.jobs or os.cpu_count() or 1)
        started = time.monotonic()
        compiled = self._run_process([cmake, "--build", str(build), "--parallel", jobs,
                                      *(["--target", *targets] if targets else [])], log, f"compile of {sha[:12]}",
                                     env=self._ccache_env(stats_log), deadline=deadline)
        out = compiled.stdout
        # CPU seconds of the compilers and linkers (Ninja waits for them all): what a fleet saves
        # by building a commit once, whatever the load made of the wall time
        metrics = {"incremental": incremental, "compile_s": time.monotonic() - started,
                   "compile_cpu_s": compiled.cpu_s,
                   "steps": len(re.findall(r"^\[\d+/\d+\]", out, flags=re.M)), "jobs": int(jobs),
                   "toolchain": self.toolchain()}
        if ccache:
            # the counts describe a good build; failing to read them is said, never the build's failure
            try:
                counted = self._run([ccache, "--print-log-stats"], [], "ccache", env=self._ccache_env(stats_log))
            except (BuildFailed, InfraFailure) as exc:
                log.append(f"warning: this build's ccache counts could not be read ({exc}); the build is good\n")
            else:
                metrics.update(self.compiler_cache.metrics(parse_stats(counted), log))
        return metrics

    def _checkout(self, sha: str, src: Path, log: list[str], deadline: float) -> None:
        """Check ``sha`` out in the workspace's source tree, fetched from this builder's mirror,
        with its submodules (and the submodule a bisection step moves, where it moves one)."""
        git = self._git()
        mirror = self.repo.repo.git_dir  # clones the mirror on first use
        if not (src / ".git").exists():
            self._run(git + ["clone", "--no-checkout", str(mirror), str(src)], log, "clone", deadline=deadline)
        # the workspace is shared by every repository built with this configuration (a fork, a
        # moved mirror): fetch from this builder's mirror, not the first one that cloned it
        self._run(git + ["-C", str(src), "remote", "set-url", "origin", str(mirror)], log, "remote set-url",
                  deadline=deadline)
        self._run(git + ["-C", str(src), "fetch", "--quiet", "origin"], log, "fetch", deadline=deadline)
        # git keeps the mtimes of files a checkout does not change: Ninja rebuilds only the rest
        self._run(git + ["-C", str(src), "checkout", "--force", "--detach", sha], log, f"checkout of {sha[:12]}",
                  deadline=deadline)
        self._run(git + ["-C", str(src), "submodule", "sync", "--recursive"], log, "submodule sync", deadline=deadline)
        # all submodules, or the listed ones (a CPU build of TVM needs just 3rdparty/tvm-ffi), with
        # their parents and their own submodules; a pin missing from a mirror takes its fallback
        update_submodules(self._step(log, deadline), git, src, only=self.config.submodules,
                          fallbacks=self.config.submodule_fallbacks, log=log)
        pin = self._pins.get(sha)
        if pin is not None:
            self._move_submodule(src, pin, git, log, deadline)

    def _write_config(self, build: Path, log: list[str]) -> tuple[Path, str]:
        """Write the build directory's ``config.cmake`` (only on change: no needless reconfigure).
        Returns the cache directory, resolved, and the build directory relative to it."""
        lines = [f"set({name} {_cmake_value(value)})\n" for name, value in sorted(self.config.cmake.items())]
        config_cmake = "".join(lines) + "set(CMAKE_BUILD_TYPE Release)\n"
        # the workspace is the build user's: abwatch reads and writes there without following links
        mine = self.cache_dir.resolve()
        relative = str(build.resolve().relative_to(mine)) if build.resolve().is_relative_to(mine) else None
        if relative is None:
            raise BuildFailed(f"the build directory {build} is not inside cache_dir {self.cache_dir} (a link?)", "", 0.0)
        self._run(["mkdir", "-p", str(build)], log, "build directory")
        try:
            if read_inside(mine, f"{relative}/config.cmake") != config_cmake:
                write_inside(mine, f"{relative}/config.cmake", config_cmake)  # only on change: no needless reconfigure
        except OSError as exc:
            raise BuildFailed(f"{build}/config.cmake: {exc.strerror} (the build directory holds a link?)", "", 0.0) from None
        return mine, relative

    def _move_submodule(self, src: Path, pin: SubmodulePin, git: list[str], log: list[str], deadline: float) -> None:
        """Check the submodule ``pin.path`` of the checkout out at ``pin.sha`` (from its mirror,
        through ``submodule_rewrites``), with its own submodules at that commit. A commit the
        mirror lacks fails the build: a bisection skips it as it skips a broken commit."""
        sub = src / pin.path
        log.append(f"note: {pin.path} moved to {pin.sha} for this build (bisection into its bump)\n")
        self._run(git + ["-C", str(sub), "fetch", "--quiet", "origin"], log, f"fetch of {pin.path}", deadline=deadline)
        try:
            self._run(git + ["-C", str(sub), "checkout", "--force", "--detach", pin.sha], log,
                      f"checkout of {pin.path} at {pin.sha[:12]}", deadline=deadline)
        except BuildFailed:  # a commit no branch holds: asked for by its sha
            self._run(git + ["-C", str(sub), "fetch", "--quiet", "origin", pin.sha], log,
                      f"fetch of {pin.path} {pin.sha[:12]}", deadline=deadline)
            self._run(git + ["-C", str(sub), "checkout", "--force", "--detach", pin.sha], log,
                      f"checkout of {pin.path} at {pin.sha[:12]}", deadline=deadline)
        update_submodules(self._step(log, deadline), git, sub, prefix=f"{pin.path}/", only=self.config.submodules,
                          fallbacks=self.config.submodule_fallbacks, log=log)

    def _store(self, key: str, sha: str, log: list[str]) -> Path:
        src, build = self.workspace / "src", self.workspace / "build"
        with tempfile.TemporaryDirectory(prefix="abwatch-src-artifact-") as tmp:
            os.chmod(tmp, 0o711)  # the post-build check, as the sandbox's user, runs in it
            staging = Path(tmp) / "a"
            (staging / "lib").mkdir(parents=True)
            # nothing is copied through a link out of the workspace (builders.safe_copy): a refusal
            # is the commit's build failure, a link dropped is said in its log
            try:
                libraries = sorted({resolved_inside(build, p) for pattern in self.config.libraries
                                    for p in build.glob(pattern) if p.is_file()})
                if not libraries:
                    raise BuildFailed(f"build of {sha[:12]} produced no library matching {self.config.libraries}",
                                      "", 0.0)
                for library in libraries:  # a versioned library's link inside the build: its file
                    copy_file(Path(os.path.realpath(library)), staging / "lib" / library.name, log)
                python = inside(src, self.config.python_dir)
                if python.is_dir():
                    copy_tree(python, staging / "python", ignore=("__pycache__", "*.pyc", "build", "*.egg-info"),
                              said=log)
                for kept in self.config.keep:  # scripts of script:repo: and command workloads
                    _copy_into(src, kept, staging / "src", log)
            except UnsafeArtifact as exc:
                raise BuildFailed(f"build of {sha[:12]}: {exc}", "", 0.0) from None
            ffi = ffi_state(src, self._git_output)
            # the venv travels inside the artifact (its files stored once by content, as the
            # libraries are), so the artifact runs on another host: see builders.venv_copy
            venv = Path(self._venv(ffi, log)).parent.parent
            host_paths = copy_venv(venv, staging / VENV_DIR, log)
            if host_paths:
                log.append(f"note: the build's venv names paths of this host ({'; '.join(host_paths)[:500]}): "
                           "the artifact is not shared with other hosts\n")
            info = {"python": f"{VENV_DIR}/bin/python", "env_paths": {"PYTHONPATH": "python", "TVM_LIBRARY_PATH": "lib"},
                    "sha": sha, "libraries": [p.name for p in libraries],
                    **({"submodule_pin": self._pins[sha].describe} if sha in self._pins else {}),
                    **({"host_paths": host_paths} if host_paths else {}),
                    **({"tvm_ffi_submodule": ffi.describe} if ffi else {})}
            (staging / ARTIFACT_INFO).write_text(json.dumps(info, sort_keys=True))
            self._check(staging, ffi, log)
            # one series per workspace: older builds of this configuration are packed against this one
            series = self.config.workspace_hash() if self.config.pack_deltas else None
            return self.cache.put_deduplicated(key, staging, {"sha": sha, "builder": self.kind}, series=series,
                                               allow_link=venv_interpreter, said=log)

    def portable(self, artifact: Path) -> bool:
        """An artifact with its venv inside (a relative ``python``) and no path of this host in
        it; an older artifact, whose ``python`` is the workspace's venv, runs here only."""
        try:
            info = artifact_info(artifact)
        except ArtifactInfoError:
            return False
        return info is not None and not Path(info["python"]).is_absolute() and not info.get("host_paths")

    def runs_here(self, artifact: Path) -> str | None:
        """The venv's interpreter (same path, same ``X.Y``) and the libraries' dependencies (the
        build host's LLVM, say) must be on this host: neither is part of the artifact key."""
        problem = interpreter_problem(artifact / VENV_DIR) if (artifact / VENV_DIR).is_dir() else None
        missing = missing_libraries(sorted((artifact / "lib").glob("*.so")))
        if missing:
            problem = (f"{problem}; " if problem else "") + f"its libraries need {', '.join(missing)}, not on this host"
        return problem

    def _venv(self, ffi: FfiState | None, log: list[str]) -> str:
        """The shared venv with ``python_packages`` (copied into each artifact); its python path.

        ``{ffi_version}`` in a requirement becomes the submodule's release when the submodule
        sits at a release tag; between tags the package is built from the submodule's own
        source instead (a release's Python side may not match the library built here), with
        the build's CMake settings and ccache (``builders.tvm_ffi``).
        """
        packages, from_source = [], None
        for requirement in self.config.python_packages:
            if "{ffi_version}" in requirement:
                if ffi is None:
                    log.append(f"note: no 3rdparty/tvm-ffi submodule; skipping {requirement}\n")
                elif ffi.release:
                    packages.append(requirement.replace("{ffi_version}", ffi.release))
                else:
                    from_source = ffi
                continue
            packages.append(requirement)
        settings = package_settings(self.config.cmake, tool("ccache")) if from_source else []
        key = packages + ([f"tvm-ffi source {from_source.sha}", *settings] if from_source else [])
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
        venv = self.workspace.parent / f"venv-{digest}"
        # abwatch writes the completion mark in a directory it owns: the build's own user may write the venv
        done = self.workspace.parent / f"{venv.name}.complete"
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            self._run([sys.executable, "-m", "venv", str(venv)], log, "venv")
            # the build has no network: what pip installs is downloaded first (builders.wheelhouse)
            wheels = wheelhouse(self.cache_dir)
            needs = [p for p in packages if not Path(p).is_dir()]
            for local in (p for p in packages if Path(p).is_dir()):
                needs += local_needs(Path(local), ".")
            log.append(download(needs, wheels, child_env(self.config.env), self.config.timeout_s, "pip install"))
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                   *install_options(wheels)]
            if packages:
                self._run(pip + packages, log, "pip install")
            if from_source:
                self._ffi_package(from_source, pip, log)
            done.write_text(json.dumps(key))
        return str(venv / "bin" / "python")

    def _ffi_package(self, ffi: FfiState, pip: list[str], log: list[str]) -> None:
        """Build and install apache-tvm-ffi from a worktree of the submodule at its commit."""
        log.append(f"note: 3rdparty/tvm-ffi is at {ffi.describe}, between release tags: its Python "
                   "package is built from the submodule's source\n")
        step = self._step(log, time.monotonic() + self.config.timeout_s, self._ccache_env())
        wheels = wheelhouse(self.cache_dir)

        def download_needs(worktree: Path) -> None:  # its build requirements: scikit-build-core, ...
            log.append(download(local_needs(self.workspace.parent, worktree.name), wheels,
                                child_env(self.config.env), self.config.timeout_s, "tvm-ffi package"))

        install_package(step, self._git(), ffi, self.workspace.parent / f"tvm-ffi-src-{ffi.sha[:12]}", pip,
                        cmake=self.config.cmake, launcher=tool("ccache"),
                        fallbacks=self.config.submodule_fallbacks, log=log, output=self._git_output,
                        before_install=download_needs)

    def _git_output(self, argv: list[str]) -> str:
        """A git command's standard output (empty when it fails), run in the build's sandbox: the
        checkout is the build user's, and abwatch runs no git where code under test writes."""
        proc = run_process(argv, cwd=None, env=child_env(self.config.env), timeout_s=300, sandbox=self._sandbox)
        return proc.stdout if proc.returncode == 0 else ""

    def _ccache_env(self, stats_log: Path | None = None) -> dict[str, str]:
        """The build's environment with ccache's: one cache for every workspace and package build,
        and the remote storage when this build uses it (``compiler_cache.begin``)."""
        return child_env(self.config.env, self.compiler_cache.env(stats_log))

    def _check(self, staging: Path, ffi: FfiState | None, log: list[str]) -> None:
        """Import ``check_import`` with the new build (and for ``tvm`` with LLVM, compile a small
        module): a build whose Python side does not match its libraries fails here, naming both
        tvm-ffi versions, instead of failing every workload later."""
        if not self.config.check_import:
            return
        compiles = self.config.check_import == "tvm" and self.config.cmake.get("USE_LLVM", "OFF").upper() != "OFF"
        env = child_env(self.config.env, build_environment(staging))
        # the device backends the configuration asks for: each must be in the build's runtime
        # (tvm.runtime.enabled); whether a driver lists a device is only logged
        # (a build host need not have the device it builds for)
        backends = built_backends(self.config.cmake)
        argv = [str(build_python(staging)), "-c", CHECK, self.config.check_import, "1" if compiles else "",
                ",".join(backends) if self.config.check_import == "tvm" else ""]
        log.append(f"$ {' '.join(argv[:2])} <post-build check: import {self.config.check_import}>\n")
        proc = run_process(argv, cwd=staging, env=env, timeout_s=600, merge_stderr=True, sandbox=Sandbox())
        log.append(cut_log(proc.stdout, LOG_LIMIT, proc.cut))
        if proc.returncode == 0 and not proc.timed_out:
            return
        installed = next((line.split(" ", 1)[1] for line in proc.stdout.splitlines()
                          if line.startswith("apache-tvm-ffi ")), "not installed")
        tail = proc.stdout.strip().splitlines()[-1:] or ["timed out" if proc.timed_out else "no output"]
        raise BuildFailed(f"post-build check: import {self.config.check_import} failed "
                          f"({tail[0][:300]}); tvm-ffi: submodule {ffi.describe if ffi else 'absent'}, "
                          f"Python package apache-tvm-ffi {installed}", "", 0.0)


OFF = ("OFF", "0", "FALSE", "NO", "")


def built_backends(cmake: dict[str, str]) -> list[str]:
    """The device APIs (core's DEVICE_BACKENDS) whose CMake flag ``cmake`` turns on: the
    post-build check asks the build's runtime for each."""
    return [backend.name for backend in DEVICE_BACKENDS.values()
            if backend.cmake is not None and cmake.get(backend.cmake, "OFF").upper() not in OFF]

# Run by the build's Python after a build: versions first, then the import, each device backend
# the configuration asks for (its runtime, the driver's devices), a compile.
CHECK = """
import importlib, importlib.metadata, sys
try:
    print("apache-tvm-ffi", importlib.metadata.version("apache-tvm-ffi"), flush=True)
except importlib.metadata.PackageNotFoundError:
    print("apache-tvm-ffi not installed", flush=True)
module = importlib.import_module(sys.argv[1])
for api in filter(None, sys.argv[3].split(",")):
    # the runtime decides: recent TVM's libinfo() is a Python fallback of defaults, a hint only
    enabled = bool(module.runtime.enabled(api))
    try:  # a hint only: a build without libinfo() still answers
        hint = module.support.libinfo().get("USE_" + api.upper(), "absent")
    except Exception:
        hint = "unknown"
    print(f"backend {api}: runtime loaded: {enabled}, devices: {int(enabled and module.device(api).exist)} "
          f"(libinfo says USE_{api.upper()}={hint})", flush=True)
    if not enabled:
        sys.exit(f"the {api} backend asked for (USE_{api.upper()}) is not in the build's runtime")
if sys.argv[2]:
    from tvm import te
    a = te.placeholder((8,), "float32", "a")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
    module.compile(module.IRModule({"main": te.create_prim_func([a, b])}), target="llvm")
print("check passed", flush=True)
"""


def _copy_into(src: Path, kept: str, into: Path, said: list[str] | None = None) -> None:
    """Copy the kept file or directory ``kept`` of the checkout ``src`` into ``into`` (never
    through a link: :class:`UnsafeArtifact` for one that is or passes through a link)."""
    source, target = inside(src, kept), into / kept
    if not source.exists():
        raise BuildFailed(f"build.keep: {kept} is not in this commit", "", 0.0)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        copy_tree(source, target, ignore=(".git", "__pycache__"), said=said)
    else:
        copy_file(source, target, said)


def _cmake_value(value: str) -> str:
    """``value`` as one CMake argument: quoted when it has spaces or semicolons (else it splits)."""
    if value and not re.search(r'[\s;"\\()#$]', value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'

