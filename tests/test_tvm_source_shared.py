"""A tvm-source build shared through the artifact store: host A builds the TVM-shaped project
(real CMake, Ninja, ccache) and pushes it to a real nginx WebDAV store, with its manifest in a
real PostgreSQL database; host B, another cache directory at another path, fetches it without
compiling anything and runs it after host A's directories are gone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.builders import make_builder
from abwatch.builders.spec import ARTIFACT_INFO, ArtifactsConfig
from abwatch.service.compare.building import build_commits
from abwatch.service.store import db
from abwatch.service.store.models import ArtifactManifest

import test_tvm_source
from test_tvm_source import make_config, run_python
from test_artifact_store import Said
from webdav import WebDav

pytestmark = pytest.mark.slow  # real builds and real servers

project = test_tvm_source.project  # the TVM-shaped project's fixture, built once per module here too
VERSION = "import tvmshaped; print(tvmshaped.version())"


def host(project, cache: Path, url: str):
    return make_builder(make_config(project, cache).model_copy(update={"artifacts": ArtifactsConfig(store=url)}))


def build(engine, builder, sha: str) -> tuple[Path, Said]:
    said = Said()
    with Session(engine, expire_on_commit=False) as session:
        [outcome] = build_commits(session, builder, [sha], said)
    assert outcome.status == "success", said.text()
    return builder.cache.get(builder.cache_key(sha)), said


@pytest.fixture
def shared(tmp_path, fresh_pg_url):
    """A real nginx store and a migrated PostgreSQL database: (store, engine)."""
    store = WebDav(tmp_path / "store").start()
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    yield store, engine
    store.stop()
    engine.dispose()


def stored(store: WebDav) -> tuple[int, int]:
    objects = store.objects()
    return len(objects), sum(p.stat().st_size for p in objects)


def test_a_tvm_source_build_is_fetched_and_runs_on_another_host(project, tmp_path, shared):
    _, _, shas = project
    store, engine = shared
    a = host(project, tmp_path / "host-a", store.url)
    assert a.shareable and a.store is not None
    first_a, said_a = build(engine, a, shas["first"])
    assert "pushed" in said_a.text() and a.portable(first_a)
    info = json.loads((first_a / ARTIFACT_INFO).read_text())
    assert info["python"] == "venv/bin/python" and "host_paths" not in info
    first_objects, first_bytes = stored(store)
    # the next commit changes one library: its objects are that library and the artifact's
    # description; the venv and the unchanged library are in the store already
    build(engine, a, shas["compiler"])
    objects, size = stored(store)
    added_objects, added_bytes = objects - first_objects, size - first_bytes
    print(f"store: first commit {first_objects} objects, {first_bytes} bytes; "
          f"second commit added {added_objects} objects, {added_bytes} bytes")
    assert 1 <= added_objects <= 3 and added_bytes < first_bytes / 20

    b_cache = tmp_path / "elsewhere" / "host-b"
    b = host(project, b_cache, store.url)
    first_b, said_b = build(engine, b, shas["first"])
    assert "fetched" in said_b.text(), said_b.text()
    assert first_b.is_relative_to(b_cache)
    assert not list(b_cache.glob("tvm-source*")) and not (b_cache / "ccache").exists()  # nothing compiled
    with Session(engine) as session:
        assert len(session.scalars(select(ArtifactManifest)).all()) == 2
    shutil.rmtree(tmp_path / "host-a")  # the build host's workspace, venv and cache are gone
    assert run_python(first_b, VERSION).strip() == "43"
    assert run_python(first_b, "import sys; print(sys.prefix)").strip() == str(first_b / "venv")
    assert "46" not in run_python(first_b, VERSION)
    # no file of the fetched artifact names host A
    for path in first_b.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert str(tmp_path / "host-a").encode() not in path.read_bytes(), path
    pip = first_b / "venv" / "bin" / "pip"  # a script of the venv starts the python beside it
    shown = subprocess.run([str(pip), "--version"], capture_output=True, text=True, check=True).stdout
    assert str(first_b / "venv") in shown, shown


def test_an_older_artifact_naming_the_workspace_venv_stays_local(project, tmp_path):
    """An artifact built before the venv moved inside names the workspace's python by absolute
    path: it still runs here, and is never pushed."""
    builder = make_builder(make_config(project, tmp_path))
    old = tmp_path / "old"
    old.mkdir()
    (old / ARTIFACT_INFO).write_text(json.dumps({"python": "/usr/bin/python3", "env_paths": {}}))
    assert not builder.portable(old)
    (old / ARTIFACT_INFO).write_text(json.dumps({"python": "venv/bin/python", "host_paths": ["x.pth: /src"]}))
    assert not builder.portable(old)
    (old / ARTIFACT_INFO).write_text(json.dumps({"python": "venv/bin/python"}))
    assert builder.portable(old)


def test_a_workspace_configured_before_origin_rpaths_is_configured_again(project, tmp_path):
    """A workspace configured without CMAKE_BUILD_RPATH_USE_ORIGIN (before artifacts were shared)
    is configured again once: its libraries then name no path of the build directory."""
    _, _, shas = project
    builder = make_builder(make_config(project, tmp_path))
    builder.build(shas["first"])
    cache = builder.workspace / "build" / "CMakeCache.txt"
    cache.write_text(cache.read_text().replace("CMAKE_BUILD_RPATH_USE_ORIGIN:BOOL=ON", "CMAKE_BUILD_RPATH_USE_ORIGIN:BOOL=OFF"))
    artifact = builder.build(shas["compiler"])
    assert artifact.metrics["incremental"] is True and "-DCMAKE_BUILD_RPATH_USE_ORIGIN:BOOL=ON" in artifact.log
    assert "CMAKE_BUILD_RPATH_USE_ORIGIN:BOOL=ON" in cache.read_text()
    for library in (artifact.path / "lib").iterdir():
        assert str(builder.workspace).encode() not in library.read_bytes(), library
    assert run_python(artifact.path, VERSION).strip() == "44"


def test_an_artifact_made_for_another_python_is_built_here(project, tmp_path, shared):
    """The store's objects are what host A built, but for A's interpreter: a host whose Python
    differs (here: A's venv says 3.2) refuses the fetched copy, says why, and builds the commit."""
    _, _, shas = project
    store, engine = shared
    a = host(project, tmp_path / "host-a", store.url)
    build(engine, a, shas["first"])
    [cfg] = a.workspace.parent.glob("venv-*/pyvenv.cfg")  # the venv every build of A copies
    cfg.write_text("".join("version = 3.2.1\n" if line.startswith("version") else line
                           for line in cfg.read_text().splitlines(keepends=True)))
    build(engine, a, shas["compiler"])  # pushed with the venv of "Python 3.2"
    b_cache = tmp_path / "host-b"
    b = host(project, b_cache, store.url)
    compiler_b, said = build(engine, b, shas["compiler"])
    text = said.text()
    assert "cannot run on this host (it was built for Python 3.2;" in text, text
    assert "  fetched " not in text
    assert list(b_cache.glob("tvm-source/*/build")), "host B compiled the commit itself"
    assert run_python(compiler_b, VERSION).strip() == "44"
    # the first commit's objects were made for this Python: fetched, nothing compiled for it
    _, said_first = build(engine, b, shas["first"])
    assert "fetched" in said_first.text(), said_first.text()


def test_runs_here_names_a_missing_interpreter_and_a_missing_library(project, tmp_path):
    """What a host lacks, each said: the venv's interpreter path, and a library the build's
    libraries link against (a real ELF library whose dependency is not installed)."""
    builder = make_builder(make_config(project, tmp_path / "cache"))
    artifact = tmp_path / "artifact"
    (artifact / "venv" / "bin").mkdir(parents=True)
    (artifact / "venv" / "pyvenv.cfg").write_text("home = /opt/elsewhere/bin\nversion = 3.11.2\n")
    (artifact / "venv" / "bin" / "python").symlink_to("/opt/elsewhere/bin/python3.11")
    (artifact / "lib").mkdir()
    dep, lib = tmp_path / "libabwatchdep.so", artifact / "lib" / "libuser.so"
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "user.c").write_text("int dep(void);\nint user(void) { return dep(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(dep), str(tmp_path / "dep.c")], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "user.c"), f"-L{tmp_path}",
                    "-labwatchdep"], check=True)
    said = builder.runs_here(artifact)
    assert said == ("its interpreter /opt/elsewhere/bin/python3.11 is not on this host; its libraries need "
                    "libabwatchdep.so, not on this host"), said
    (artifact / "venv" / "bin" / "python").unlink()
    (artifact / "venv" / "bin" / "python").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    lib.unlink()
    version = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (artifact / "venv" / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {version}.0\n")
    assert builder.runs_here(artifact) is None
