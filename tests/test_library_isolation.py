"""One side's TVM workers cannot touch what the other side's load: each (side, build) has its
own directory of libraries and saved inputs, written by its compiling worker alone.

The hostile side is a stand-in, said so: a hard-linked copy of the apache-tvm wheel's venv
whose ``sitecustomize`` (run by every process of that build, as a pull request's own TVM
would be) tries to replace, append to, remove and add beside the other side's library and
saved inputs, and to list the directory that holds every side's, then stops its worker with a
report of what it managed."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from abwatch.builders import TvmWheelBuilder
from abwatch.builders.spec import RunnerConfig
from abwatch.runners import CpuRunner
from abwatch.service.config import Config, TvmWheelBuildConfig, TvmWorkloadConfig
from tests.test_sandbox import _host_can_sandbox

pytestmark = pytest.mark.slow  # real TVM processes (~20 s on 2 busy cores)

MLP = TvmWorkloadConfig(name="mlp", model="builtin:mlp", input_shape=[1, 64], options={"hidden": 64}, samples=20)

# Runs first in every process of the hostile build: each attempt on the targets (tamper.json,
# beside it) that succeeds is reported, and so is each target it could not see at all.
HOSTILE = '''import json, os, pathlib
here = pathlib.Path(__file__).parent
targets = json.loads((here / "tamper.json").read_text())
done, unseen = [], [t for t in targets["files"] if not os.path.exists(t)]

def attempt(what, action):
    try:
        action()
        done.append(what)
    except OSError:
        pass

for target in targets["files"]:
    attempt("append " + target, lambda: open(target, "ab").write(b"hostile"))
    attempt("remove " + target, lambda: os.remove(target))
    attempt("rename " + target, lambda: os.rename(target, target + ".moved"))
directory = os.path.dirname(targets["files"][0])
attempt("add beside", lambda: open(os.path.join(directory, "planted.so"), "wb").write(b"hostile"))
attempt("list " + targets["root"], lambda: os.listdir(targets["root"]))
raise SystemExit(f"HOSTILE saw-none-of={unseen} did={done}")
'''


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def artifact(tvm_cache) -> Path:
    config = Config(build=TvmWheelBuildConfig(), cache_dir=tvm_cache, workloads=[MLP])
    return TvmWheelBuilder(config).build("0.27.0.post1").path


@pytest.mark.parametrize("processes", ["fresh", "forked"])
def test_one_sides_workers_cannot_change_what_the_other_sides_load(artifact, tmp_path, processes):
    _host_can_sandbox()
    hostile = tmp_path / artifact.name
    subprocess.run(["cp", "-al", str(artifact), str(hostile)], check=True)
    (site,) = hostile.glob("lib/python3*/site-packages")
    (site / "sitecustomize.py").write_text(HOSTILE)  # a new file: the wheel's venv has none to change
    tmp_path.chmod(0o755)  # the sandbox's user runs the copy
    runner = CpuRunner(RunnerConfig(threads=1, processes=processes))
    try:
        assert runner.run(artifact, MLP, 120, "control").status == "ok"  # compiles, exports, saves inputs
        library, saved = runner.tvm._lib(artifact, MLP, "control"), runner.tvm._saved(artifact, MLP, "control")
        before = {path: digest(path) for path in (library, saved)}
        (site / "tamper.json").write_text(json.dumps({"files": [str(library), str(saved)],
                                                      "root": str(library.parent.parent)}))
        tampering = runner.run(hostile, MLP, 120, "treatment")  # compiling worker of the other side
        later = [runner.run(artifact, MLP, 120, "control") for _ in range(2)]
        after = {path: digest(path) for path in before}
    finally:
        runner.teardown()
    # the hostile worker ran, saw both files, and managed nothing
    assert tampering.status == "error" and "HOSTILE saw-none-of=[] did=[]" in tampering.message, tampering.message
    # the control's later workers load exactly what its compiling worker wrote, on the runtime
    # library (the saved inputs were not replaced), and time it
    assert all(r.status == "ok" and len(r.samples) == 20 for r in later), [r.message for r in later]
    assert after == before
    assert not runner.tvm.runtime_refused
