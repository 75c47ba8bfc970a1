"""TVM engineers' own workloads on the real apache-tvm wheels (0.26.0 and 0.27.0.post1):
``script:`` workloads (the two examples shipped in config/workloads/, a TIR-only module, bad
scripts) and a ``command`` workload that runs ``python`` and so must get each build's Python.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from abwatch.service.cli.main import main
from tests.test_tvm import compare, write

pytestmark = pytest.mark.slow  # real TVM builds and workers

EXAMPLES = Path(__file__).resolve().parent.parent / "config" / "workloads"


def script_workload(name: str, path: Path, options: str = "") -> str:
    return f'''
[[workloads]]
name = "{name}"
kind = "tvm"
model = "script:{path}"
{options}
'''


def test_script_workloads_and_a_command_on_the_builds_python(capsys, tmp_path, tvm_cache, sqlite_url):
    for example in ("attention_tvmscript.py", "mlp_nn.py"):
        shutil.copy(EXAMPLES / example, tmp_path / example)
    (tmp_path / "tir_add.py").write_text('''import tvm
from tvm import te

def workload(n=4096):
    a, b = te.placeholder((n,), "float32", "a"), te.placeholder((n,), "float32", "b")
    c = te.compute((n,), lambda i: a[i] * 2.0 + b[i], name="c")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
''')
    (tmp_path / "results").mkdir()  # a workload writes only where [sandbox] writable lets it
    seen = tmp_path / "results" / "seen.txt"
    (tmp_path / "bench.py").write_text(f'''import json, time, tvm
with open({str(seen)!r}, "a") as out:
    out.write(tvm.__version__ + "\\n")
start = time.perf_counter()
sum(range(20000))
print(json.dumps({{"runtime_ms": (time.perf_counter() - start) * 1000}}))
''')
    workloads = (script_workload("attention", Path("attention_tvmscript.py"))  # relative to the config
                 + script_workload("ffn", Path("mlp_nn.py"), "options = {tokens = 8, dim = 64, hidden = 128}")
                 + script_workload("tir_add", tmp_path / "tir_add.py", "options = {n = 2048}")
                 + f'''
[[workloads]]
name = "bench"
kind = "command"
command = ["python", "bench.py"]
cwd = "{tmp_path}"
[sandbox]
writable = ["{tmp_path / 'results'}"]
''')
    config = write(tmp_path, tvm_cache, workloads, run="repetitions = 4\nmax_repetitions = 4\ncompile_repetitions = 4")
    code, payload, err = compare(capsys, config, sqlite_url)
    assert code in (0, 1), err
    results = {r["workload"]: r for r in payload["results"]}
    for name in ("attention", "ffn", "tir_add"):
        result = results[name]
        assert result["failure"] is None and result["verdict"] in ("same", "regression", "improvement", "unknown")
        assert result["compile"]["verdict"] in ("same", "regression", "improvement", "unknown")
        assert result["error"]["mismatch"] is False and result["compile_ms"]["control"] > 0
    ops = {name: {op["name"]: op for op in results[name]["ops"]} for name in results if name != "bench"}
    assert {"matmul", "softmax"} <= set(ops["attention"]) and "gelu" in ops["ffn"]
    assert results["bench"]["failure"] is None
    # `python` was each build's own: both TVM versions ran the command
    assert set(seen.read_text().split()) == {"0.26.0", "0.27.0.post1"}
    # the options reached workload(): the nn block's activation is 8 x 64, the TIR vectors 2048 long
    assert ops["ffn"]["layer_norm"]["shapes"][0] == [1, 8, 64]
    assert ops["tir_add"]["main"]["shapes"] == [[2048], [2048], [2048]]


@pytest.mark.parametrize("body, says", [
    ("def workload():\n    raise RuntimeError('no model today')\n",
     "bad.py:2: workload() raised RuntimeError: no model today"),
    ("def workload():\n    return 42\n", "bad.py: workload() returned int, expected an IRModule"),
    ("import no_such_module_here\ndef workload():\n    pass\n", "bad.py:1: ModuleNotFoundError"),
])
def test_a_bad_script_is_an_error_naming_the_file(capsys, tmp_path, tvm_cache, sqlite_url, body, says):
    (tmp_path / "bad.py").write_text(body)
    config = write(tmp_path, tvm_cache, script_workload("bad", tmp_path / "bad.py"), run="repetitions = 2")
    code, payload, err = compare(capsys, config, sqlite_url)
    result = payload["results"][0]
    assert code == 4 and result["verdict"] == "unknown" and result["regression_id"] is None
    assert says in result["failure"] and "Traceback" not in result["failure"], result["failure"]


def test_a_script_with_a_syntax_error_is_a_config_error(capsys, tmp_path, tvm_cache, sqlite_url):
    (tmp_path / "bad.py").write_text("def workload(:\n    pass\n")
    config = write(tmp_path, tvm_cache, script_workload("bad", tmp_path / "bad.py"))
    code = main(["compare", "--config", config, "--control", "0.26.0", "--treatment", "0.27.0.post1",
                 "--db", sqlite_url])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'bad.py'}:1: SyntaxError" in err and "tvm.toml" in err


def test_a_script_workload_runs_on_a_board_through_the_rpc_tracker(capsys, tmp_path, tvm_cache, sqlite_url, rpc_board):
    # compiled on this host in the build's Python, uploaded to the board (an RPC server on
    # 127.0.0.1 behind a real tracker) and timed there, like a built-in model
    tracker, _ = rpc_board
    shutil.copy(EXAMPLES / "attention_tvmscript.py", tmp_path / "attention.py")
    runner = f'kind = "rpc"\ntracker = "{tracker}"\nkey = "local-cpu"'
    config = write(tmp_path, tvm_cache, script_workload("attention", Path("attention.py")), runner=runner)
    code, payload, err = compare(capsys, config, sqlite_url)
    assert code in (0, 1), err
    result = payload["results"][0]
    assert result["failure"] is None and result["error"]["mismatch"] is False, result
    assert result["control"]["n"] > 0 and result["treatment"]["n"] > 0
