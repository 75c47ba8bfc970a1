"""Config loading: the contract's keys, defaults, and errors that name file and key."""

from __future__ import annotations

import pytest

from abwatch.service.config import CommandBuildConfig, ConfigError, load_config

VALID = """
[repo]
url = "repo"
branch = "main"

[build]
kind = "command"
command = ["sh", "build.sh"]
artifacts = "out"

[[workloads]]
name = "loop"
kind = "command"
command = ["./bench"]
"""


def write(tmp_path, text, name="abwatch.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_contract_keys_load_with_defaults(tmp_path):
    config = load_config(write(tmp_path, VALID))
    assert config.repo.url == str((tmp_path / "repo").resolve())  # relative to the config file
    assert config.build.command == ["sh", "build.sh"]
    assert config.build.artifacts == "out"
    assert config.workloads[0].command == ["./bench"]
    assert config.runner.kind == "cpu"
    assert config.stats.threshold_pct < 2.0  # the minimum effect of interest is below 2 %
    assert config.run.repetitions >= 2


def test_remote_urls_are_kept_verbatim(tmp_path):
    text = VALID.replace('url = "repo"', 'url = "https://example.invalid/tvm.git"')
    assert load_config(write(tmp_path, text)).repo.url == "https://example.invalid/tvm.git"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('command = ["sh", "build.sh"]\n', ""), "abwatch.toml: build.command: field required"),
        (lambda t: t.replace('[repo]\nurl = "repo"', "[repo]"), "abwatch.toml: repo.url: field required"),
        (lambda t: t.replace('artifacts = "out"', 'artifacts = "../out"'), "abwatch.toml: build.artifacts: value error"),
        (lambda t: t.replace('kind = "command"\ncommand = ["sh"', 'kind = "cmake"\ncommand = ["sh"'), "abwatch.toml: build: unknown kind; expected one of 'command', 'tvm-wheel', 'tvm-source'"),
        (lambda t: t + '\n[run]\nrepetitions = "ten"\n', "abwatch.toml: run.repetitions: input should be a valid integer"),
        (lambda t: t + '\n[run]\nrepetitons = 3\n', "abwatch.toml: run.repetitons: extra inputs are not permitted"),
        (lambda t: t.replace('command = ["./bench"]', "command = []"), "abwatch.toml: workloads[0].command: list should have at least 1 item"),
        (lambda t: t + t[t.index("[[workloads]]"):], "workload name 'loop' appears twice"),
        (lambda t: t + "\n[stats\n", "abwatch.toml: invalid TOML"),
    ],
)
def test_errors_name_file_and_key(tmp_path, edit, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, edit(VALID)))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t + '\n[run]\nrepetitons = 3\n', "run.repetitons: extra inputs are not permitted; did you mean 'repetitions'?"),
        (lambda t: t.replace('artifacts = "out"', 'artifact = "out"'), "build.artifact: extra inputs are not permitted; did you mean 'artifacts'?"),
        (lambda t: 'cache_dri = "x"\n' + t, "cache_dri: extra inputs are not permitted; did you mean 'cache_dir'?"),
        (lambda t: t + '\n[stats]\nthreshhold_pct = 2.0\n', "stats.threshhold_pct: extra inputs are not permitted; did you mean 'threshold_pct'?"),
    ],
)
def test_a_mistyped_key_is_told_the_nearest_known_one(tmp_path, edit, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, edit(VALID)))
    assert f"abwatch.toml: {message}" in str(info.value)


def test_a_key_like_no_known_one_gets_no_guess(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, VALID + '\n[run]\nzzz_qqq = 3\n'))
    assert str(info.value).endswith("run.zzz_qqq: extra inputs are not permitted")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="missing.toml: cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_config_hash_ignores_timeout_but_not_command(tmp_path):
    base = load_config(write(tmp_path, VALID)).build
    assert base.config_hash() == base.model_copy(update={"timeout_s": 5.0}).config_hash()
    assert base.config_hash() != base.model_copy(update={"command": ["make"]}).config_hash()


def test_config_hashes_stay_what_caches_and_build_rows_hold():
    # Cache keys, build rows and watch identities hold these: a changed hash rebuilds every
    # cached artifact and starts new watch series, so a change must be deliberate.
    from abwatch.service.config import TvmSourceBuildConfig, TvmWheelBuildConfig
    from abwatch.core.config_base import spec_hash
    assert CommandBuildConfig(command=["make"]).config_hash() == "4c77e072e4148f9a"
    assert TvmWheelBuildConfig(packages=["onnx", "b"]).config_hash() == "03248355197ea73e"
    assert TvmWheelBuildConfig(packages=["b", "onnx"]).config_hash() == "03248355197ea73e"
    # 4433f81156556150 since ml_dtypes and typing_extensions joined the default packages (TVM's own)
    assert TvmSourceBuildConfig().config_hash() == "4433f81156556150"
    assert TvmSourceBuildConfig(jobs=3, pack_deltas=False).config_hash() == "4433f81156556150"
    assert TvmSourceBuildConfig().workspace_hash() == "ed43edc83d2665f5"
    assert spec_hash({"b": 1, "a": [2]}) == spec_hash({"a": [2], "b": 1})


def test_adaptive_budget_is_time_with_an_optional_cap(tmp_path):
    run = load_config(write(tmp_path, VALID + "\n[run]\nrepetitions = 10\n")).run
    assert (run.max_repetitions, run.step, run.max_seconds, run.compile_repetitions) == (None, 5, 900.0, 12)
    run = load_config(write(tmp_path, VALID + "\n[run]\nrepetitions = 4\nmax_repetitions = 9\nbatch = 2\n")).run
    assert (run.max_repetitions, run.step) == (9, 2)
    with pytest.raises(ConfigError, match="max_repetitions must be >= repetitions"):
        load_config(write(tmp_path, VALID + "\n[run]\nrepetitions = 6\nmax_repetitions = 3\n"))


TVM = """
[build]
kind = "tvm-wheel"

[[workloads]]
name = "mlp"
kind = "tvm"
model = "builtin:mlp"
"""


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("treatment_options = {hidden = 640}",
         "workloads[0].treatment_options: value error, unknown key 'hidden' (the treatment may override: options, dtype"),
        ("treatment_options = {samples = 10}",
         "workloads[0].treatment_options: value error, unknown key 'samples' (the treatment may override: "
         "options, dtype, input_shape"),
        ("treatment_options = {input_shape = [0, 256]}",
         "input_shape: expected a list of positive integers such as [33, 256], not [0, 256]"),
        ("treatment_options = {options = {hiden = 640}}",
         "treatment_options.options: unknown key 'hiden' for builtin:mlp (known: hidden, classes, weight_scale)"),
        ("options = {heads = 2}", "options: unknown key 'heads' for builtin:mlp"),
        ("treatment_options = {dtype = 16}", "dtype: expected a string"),
    ],
)
def test_treatment_and_model_options_reject_unknown_keys(tmp_path, line, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, TVM + line + "\n"))
    assert message in str(info.value) and "abwatch.toml" in str(info.value)


def test_unknown_model_is_named(tmp_path):
    with pytest.raises(ConfigError, match="unknown model 'builtin:vgg'") as info:
        load_config(write(tmp_path, TVM.replace("builtin:mlp", "builtin:vgg")))
    # every known model once, each written as a config writes it
    assert "(known: builtin:cnn, builtin:llm-decode, builtin:mlp, builtin:resnet18, builtin:transformer, " \
           "te:conv2d, te:matmul, onnx:<path>, script:<path>)" in str(info.value)
    with pytest.raises(ConfigError, match="unknown model 'builtin:resnet'; did you mean 'builtin:resnet18'"):
        load_config(write(tmp_path, TVM.replace("builtin:mlp", "builtin:resnet")))


def test_supported_treatment_overrides_reach_the_treatment_worker_only(tmp_path):
    """What the treatment may override really changes what its worker compiles (the spec sent
    to runners/worker/tvm_worker.py); the control's spec stays the workload's own. The compiled
    effect is checked with real TVM in tests/test_tvm.py (heads=3 fails to compile, float16
    changes the outputs)."""
    from abwatch.runners.tvm_sessions import TvmSessions

    config = load_config(write(tmp_path, TVM + 'input_shape = [32, 256]\noptions = {hidden = 64}\n'
                               'treatment_options = {options = {hidden = 640}, dtype = "float16", '
                               'input_shape = [33, 256]}\n'))
    workload = config.workloads[0]
    sessions = TvmSessions(config.runner, {"kind": "llvm"}, "cpu")
    try:
        control = sessions.spec(workload, {})
        treatment = sessions.spec(workload, workload.treatment_options)
    finally:
        sessions.close()
    assert control["options"] == {"hidden": 64} and control["dtype"] == "float32"
    assert control["input_shape"] == [32, 256]
    assert treatment["options"] == {"hidden": 640} and treatment["dtype"] == "float16"
    assert treatment["input_shape"] == [33, 256]


SCRIPT_CONFIG = """
[repo]
url = "https://example.invalid/tvm"
[build]
kind = "{kind}"
{build}
[[workloads]]
name = "mine"
kind = "tvm"
model = "{model}"
"""


def test_script_workloads_are_resolved_hashed_and_checked(tmp_path):
    (tmp_path / "w").mkdir()
    script = tmp_path / "w" / "block.py"
    script.write_text("def workload():\n    return None\n")
    path = tmp_path / "c.toml"
    path.write_text(SCRIPT_CONFIG.format(kind="tvm-wheel", build="", model="script:w/block.py"))
    first = load_config(path).workloads[0]
    assert first.model == f"script:{script}" and len(first.script_sha256) == 64
    script.write_text("def workload():\n    return 1\n")  # a changed file: another identity
    assert load_config(path).workloads[0].script_sha256 != first.script_sha256
    script.write_text("def workload(:\n")
    with pytest.raises(ConfigError, match=rf"c\.toml: workloads\[0\] \(mine\): model: {script}:1: SyntaxError"):
        load_config(path)
    path.write_text(SCRIPT_CONFIG.format(kind="tvm-wheel", build="", model="script:w/missing.py"))
    with pytest.raises(ConfigError, match="cannot read .*missing.py"):
        load_config(path)


@pytest.mark.parametrize("kind, build, message", [
    ("tvm-wheel", "", "only a tvm-source build keeps"),
    ("tvm-source", 'keep = ["apps"]', "bench/attn.py is not under build.keep \\(apps\\)"),
])
def test_repo_scripts_need_a_source_build_that_keeps_them(tmp_path, kind, build, message):
    path = tmp_path / "c.toml"
    path.write_text(SCRIPT_CONFIG.format(kind=kind, build=build, model="script:repo:bench/attn.py"))
    with pytest.raises(ConfigError, match=message):
        load_config(path)
    path.write_text(SCRIPT_CONFIG.format(kind="tvm-source", build='keep = ["bench"]', model="script:repo:bench/attn.py"))
    assert load_config(path).workloads[0].model == "script:repo:bench/attn.py"


def test_build_environment_puts_the_builds_python_first(tmp_path):
    import json
    import os

    from abwatch.builders.environment import build_environment

    artifact = tmp_path / "a"
    (artifact / "bin").mkdir(parents=True)
    (artifact / "abwatch-artifact.json").write_text(json.dumps(
        {"python": "bin/python", "env_paths": {"TVM_LIBRARY_PATH": "lib"}, "env": {"X": "1"}}))
    env = build_environment(artifact)
    assert env["PATH"].split(os.pathsep)[0] == str(artifact / "bin")
    assert env["TVM_LIBRARY_PATH"] == str(artifact / "lib") and env["X"] == "1"
    assert env["ABWATCH_ARTIFACT"] == str(artifact) and env["VIRTUAL_ENV"] == str(artifact)
    assert build_environment(tmp_path / "plain") == {}  # a command build's artifact: nothing added


def test_the_shipped_nightly_config_loads_with_its_script_workloads():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parent.parent / "config" / "tvm-nightly.toml")
    assert config.build.kind == "tvm-source" and config.watch.schedule == "0 2 * * *"
    scripts = [w for w in config.workloads if w.kind == "tvm" and w.model.startswith("script:")]
    assert {Path(w.model.removeprefix("script:")).name for w in scripts} == {"attention_tvmscript.py", "mlp_nn.py"}
    assert all(Path(w.model.removeprefix("script:")).is_file() and w.script_sha256 for w in scripts)


def test_the_offline_nightly_config_the_benchmark_ran_loads():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parent.parent / "config" / "tvm-nightly-offline.toml")
    assert config.build.submodule_rewrites == {"https://github.com/": "/srv/mirrors/"}
    assert config.build.cmake["TVM_FFI_USE_LIBBACKTRACE"] == "OFF"
    assert [w.model.split(":")[0] for w in config.workloads] == ["builtin", "te", "script"]


def test_a_native_cpu_in_a_target_string_is_refused_with_the_table_to_write(tmp_path):
    path = tmp_path / "native.toml"
    path.write_text('[repo]\nurl = "/nowhere"\n[build]\ncommand = ["true"]\n[[workloads]]\nname = "x"\ncommand = ["true"]\n'
                    '[runner]\ntarget = "llvm -mcpu=native -num-cores=2"\n')
    with pytest.raises(ConfigError, match=r"runner.*write a native CPU as a table, e\.g\. target = \{kind = \"llvm\", "
                                          r"mcpu = \"native\"\}"):
        load_config(path)
    path.write_text(path.read_text().replace('"llvm -mcpu=native -num-cores=2"', '"llvm -mcpu=skylake"'))
    assert load_config(path).runner.target == "llvm -mcpu=skylake"


@pytest.mark.parametrize(
    ("runner", "message"),
    [
        ('processes = "spawn"', "abwatch.toml: runner.processes: input should be 'fresh' or 'forked'"),
        ("children_per_server = 0", "abwatch.toml: runner.children_per_server: input should be greater than or equal to 1"),
    ],
)
def test_how_timed_workers_start_is_checked(tmp_path, runner, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, VALID + f"\n[runner]\n{runner}\n"))
    assert message in str(info.value)


def test_a_watch_that_leaves_how_workers_start_at_its_default_is_the_same_watch(tmp_path):
    from abwatch.service.watch.poll import config_hash

    default = load_config(write(tmp_path, VALID))
    assert default.runner.processes == "forked" and default.runner.children_per_server == 8
    assert default.runner.servers_ahead is True
    assert config_hash(default) == "463a36fe14d8c344"  # what this config hashed to before the keys existed
    waiting = default.model_copy(update={"runner": default.runner.model_copy(update={"servers_ahead": False})})
    assert config_hash(waiting) != config_hash(default)
    fresh = default.model_copy(update={"runner": default.runner.model_copy(update={"processes": "fresh"})})
    assert config_hash(fresh) != config_hash(default)
    duet = default.model_copy(update={"run": default.run.model_copy(update={"schedule": "duet"})})
    assert config_hash(duet) != config_hash(default)


def test_a_tvm_workloads_children_a_server_unset_is_the_same_watch_and_never_its_series(tmp_path):
    from abwatch.service.store.rows import workload_spec_hash
    from abwatch.service.watch.poll import config_hash

    text = ('[repo]\nurl = "repo"\nbranch = "main"\n[build]\nkind = "tvm-wheel"\n'
            '[[workloads]]\nname = "mlp"\nkind = "tvm"\nmodel = "builtin:mlp"\n')
    config = load_config(write(tmp_path, text))
    assert config_hash(config) == "32b89a07daaf8a9c"  # what this config hashed to before the key existed
    (workload,) = config.workloads
    assert workload.children_per_server is None
    own = load_config(write(tmp_path, text + "children_per_server = 4\n"))
    assert own.workloads[0].children_per_server == 4 and config_hash(own) != config_hash(config)
    spec = workload.model_dump(mode="json")
    assert workload_spec_hash("tvm", {**spec, "children_per_server": 4}) == workload_spec_hash("tvm", spec)
    with pytest.raises(ConfigError, match="children_per_server: input should be greater than or equal to 1"):
        load_config(write(tmp_path, text + "children_per_server = 0\n"))


@pytest.mark.parametrize(("value", "bisected"), [
    (None, ["regression"]), ("true", ["regression"]), ("false", []),
    ('["regression", "improvement"]', ["regression", "improvement"]), ('["improvement"]', ["improvement"]),
])
def test_watch_bisect_takes_a_bool_or_the_changes_to_bisect(tmp_path, value, bisected):
    text = VALID + ("" if value is None else f"\n[watch]\nbisect = {value}\n")
    assert load_config(write(tmp_path, text)).watch.bisect == bisected


@pytest.mark.parametrize(("value", "message"), [
    ('["regresion"]', "watch.bisect[0]: input should be 'regression' or 'improvement'"),
    ('"improvement"', 'watch.bisect: value error, \'improvement\': expected true, false or a list of "regression", '
                      '"improvement"'),
    ('["improvement", "improvement"]', "watch.bisect: value error, ['improvement', 'improvement'] names a change twice"),
])
def test_watch_bisect_errors_name_the_key(tmp_path, value, message):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, VALID + f"\n[watch]\nbisect = {value}\n"))
    assert f"abwatch.toml: {message}" in str(info.value)
