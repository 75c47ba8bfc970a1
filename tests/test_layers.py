"""The layers' arrows run one way: service -> runners -> builders -> core (core at the bottom).

Builders and runners are plug-ins the service drives; if they imported the service, a new
builder could not be written, tested or run (a watch worker, a board agent) without the
database, the API and the whole CLI coming along. The words every layer shares (errors,
commits, metric names, sides, redaction, a device's identity) are in core, which imports no
other abwatch package: the service's lower packages take them from there, not from a plug-in.
No module imports another in a cycle, nor hides an import in a function (bar a short
allow-list kept for start-up time), and migrations import no abwatch code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package folder -> the abwatch packages its modules must not import
FORBIDDEN = {
    "core": ("abwatch.service", "abwatch.runners", "abwatch.builders", "abwatch.migrations"),
    "builders": ("abwatch.service", "abwatch.runners"),
    "runners": ("abwatch.service",),
}


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, anywhere in it (functions too), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package the file is in
                base = ["abwatch", path.parent.name][: max(0, 2 - (node.level - 1))]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append((node.lineno, module))
            # `from abwatch import service` names the package in the alias
            names += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return names


def modules_of(package: str) -> list[Path]:
    return sorted((ROOT / package).glob("*.py"))


def forbidden_imports(files: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """``path:line: imports name`` for each import in ``files`` of a package in ``forbidden``."""
    return [
        f"{path.relative_to(root)}:{line}: imports {name}"
        for path in files for line, name in imported_names(path)
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_an_upper_layer(package):
    files = modules_of(package)
    assert len(files) >= 5, f"found only {files} in {package}/"
    wrong = forbidden_imports(files, FORBIDDEN[package])
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path):
    # the test above would pass vacuously if imported_names missed the forms used in code
    bad = tmp_path / "builders" / "x.py"
    bad.parent.mkdir()
    bad.write_text("import os\nfrom abwatch.service.config import Config\n"
                   "def f():\n    from abwatch.service import stats\n    import abwatch.runners.cpu\n"
                   "from .. import service\n")
    names = [name for _, name in imported_names(bad)]
    assert "abwatch.service.config" in names and "abwatch.service.stats" in names
    assert "abwatch.runners.cpu" in names and "abwatch.service" in names


def test_the_checker_sees_a_core_module_importing_a_plug_in(tmp_path):
    # core's entry above would pass vacuously if a plug-in import in core went unseen
    bad = tmp_path / "core" / "x.py"
    bad.parent.mkdir()
    bad.write_text("import json\nfrom abwatch.core.errors import UsageError\nfrom abwatch.builders.spec import RepoConfig\n"
                   "def f():\n    import abwatch.runners.harness\nfrom ..builders import cache\n")
    wrong = forbidden_imports([bad], FORBIDDEN["core"], tmp_path)
    # core importing core (line 2) is fine; a builder, a runner in a function, a relative import are not
    assert sorted({w.split(": ", 1)[0] for w in wrong}) == ["core/x.py:3", "core/x.py:5", "core/x.py:6"], wrong
    assert {"core/x.py:3: imports abwatch.builders.spec", "core/x.py:5: imports abwatch.runners.harness",
            "core/x.py:6: imports abwatch.builders.cache"} <= set(wrong), wrong


def test_importing_core_loads_nothing_else_of_abwatch():
    # transitively too: a fresh interpreter imports every core module
    modules = [f"abwatch.core.{path.stem}" for path in modules_of("core") if path.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.') and not m.startswith('abwatch.core')))\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.core')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]", f"core pulled in {out[0]}"
    assert "abwatch.core.sides" in out[1] and "abwatch.core.device_identity" in out[1]


# The service's lower packages need only shared words of the plug-ins (errors, commits, metric
# names, redaction, a device's identity, JSON checks, the file lock): they take them from core,
# so storing, judging, recording and alerting never load a builder or a runner.
SHARED_WORDS_ONLY = ("stats", "store", "records", "notify")


def test_the_lower_service_packages_import_no_plug_in():
    wrong = [problem for package in SHARED_WORDS_ONLY
             for problem in forbidden_imports(sorted((ROOT / "service" / package).rglob("*.py")),
                                              ("abwatch.builders", "abwatch.runners"))]
    assert not wrong, "take the shared word from abwatch.core:\n" + "\n".join(wrong)


def test_importing_builders_and_runners_loads_no_service_module():
    # transitively too: a fresh interpreter imports every builder and runner module (the
    # worker's package, run inside a build's own Python, is checked by the AST tests below)
    modules = [f"abwatch.{package}.{path.stem}" for package in FORBIDDEN for path in modules_of(package)
               if path.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.service')))\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]", f"builders/runners pulled in {out[0]}"
    assert "abwatch.builders.spec" in out[1] and "abwatch.runners.cpu" in out[1]


def test_the_server_and_the_commands_start_without_scipy_stats():
    # scipy.stats is about a second of a process's start: service/stats imports it where it
    # judges, so `abwatch serve` and the read commands do not pay for it
    code = ("import sys, abwatch.service.web.server, abwatch.service.cli.commands\n"
            "print(sorted(m for m in sys.modules if m.startswith(('scipy.stats', 'abwatch.service.stats'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "abwatch.service.stats.core" in out and "scipy.stats" not in out, out


# The worker's side (runners/worker/) runs inside a build's own Python, where abwatch is not
# installed: it imports nothing of abwatch (its modules load each other by path). The host
# runs its files in the build's interpreter and never imports them: a host module that did
# would run TVM-side code in abwatch's process, and the worker's files could no longer change
# without the host's.
WORKER_PACKAGE = "abwatch.runners.worker"


def worker_imports_of_abwatch(root: Path = ROOT) -> list[str]:
    """Imports of abwatch (or relative ones, which are abwatch's too) in the worker's package."""
    wrong = []
    for path in sorted((root / "runners" / "worker").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     ["." * node.level + (node.module or "")] if isinstance(node, ast.ImportFrom) else
                     [target] if isinstance(node, ast.Call) and (target := _dynamic_target(node)) else [])
            wrong += [f"{path.relative_to(root)}:{node.lineno}: imports {name}" for name in names
                      if name.startswith(".") or name.split(".")[0] == "abwatch"]
    return sorted(wrong)


def host_imports_of_the_worker(root: Path = ROOT) -> list[str]:
    """Imports of the worker's package by a module outside it (host side)."""
    known = code_files(root)
    return sorted(f"{path.relative_to(root)}:{line}: imports {target}"
                  for name, path in known.items() if not _in_worker(name)
                  for line, target, _ in imports_of(path, known, root) if _in_worker(target))


def _in_worker(module: str) -> bool:
    return module == WORKER_PACKAGE or module.startswith(WORKER_PACKAGE + ".")


def test_the_worker_package_imports_nothing_of_abwatch():
    assert (ROOT / "runners" / "worker" / "tvm_worker.py").is_file()
    wrong = worker_imports_of_abwatch()
    assert not wrong, "the worker runs in a build's Python, without abwatch:\n" + "\n".join(wrong)


def test_no_host_module_imports_the_worker_package():
    wrong = host_imports_of_the_worker()
    assert not wrong, "run the worker's files in the build's Python (runners/worker_process.py, WORKER_DIR):\n" + \
        "\n".join(wrong)


def test_the_worker_checkers_see_imports_across_the_line(tmp_path):
    # the two tests above would pass vacuously if their checkers missed an import
    _plant(tmp_path, {
        "runners/__init__.py": "", "runners/worker/__init__.py": "",
        "runners/worker/tvm_worker.py": "import json\nimport numpy\ndef f():\n    from abwatch.core import errors\n"
                                        "from . import ops\nimport importlib\nimportlib.import_module('abwatch.x')\n",
        "runners/worker/ops.py": "import os\n",
        "runners/gpu.py": "from abwatch.runners.worker import ops\nfrom abwatch.runners import worker\n",
        "runners/workloads.py": "from abwatch.runners import gpu\n",  # worker*s* is not the worker's package
    })
    assert worker_imports_of_abwatch(tmp_path) == [
        "runners/worker/tvm_worker.py:4: imports abwatch.core", "runners/worker/tvm_worker.py:5: imports .",
        "runners/worker/tvm_worker.py:7: imports abwatch.x"]
    assert host_imports_of_the_worker(tmp_path) == [
        "runners/gpu.py:1: imports abwatch.runners.worker.ops", "runners/gpu.py:2: imports abwatch.runners.worker"]


# Inside service/: each package may import only the packages below it in the pipeline
# (and the shared top-level modules config and exits). The read side serves the CLI, the
# API, the dashboard and alerts alike, so nothing below it knows how things are shown.
SERVICE_PACKAGES: dict[str, set[str]] = {
    "stats": set(),
    "store": {"stats"},
    "records": {"stats", "store"},
    "notify": {"stats", "store"},
    "compare": {"stats", "store", "records", "notify"},
    "read": {"stats", "store", "records", "compare"},
    "watch": {"stats", "store", "records", "notify", "compare"},
    "web": {"stats", "store", "records", "compare", "read", "watch"},  # POST /api/jobs queues work
    "cli": {"stats", "store", "records", "notify", "compare", "read", "watch", "web"},
}
SHARED = {"config", "exits"}


def service_package_of(name: str) -> str | None:
    """``compare`` for ``abwatch.service.compare.driver`` (and for the package itself)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["abwatch", "service"] else None


def test_service_packages_import_only_downward():
    found = sorted(p.name for p in (ROOT / "service").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert found == sorted(SERVICE_PACKAGES), "a new package in service/ needs its place in SERVICE_PACKAGES"
    wrong = []
    for package, allowed in SERVICE_PACKAGES.items():
        for path in sorted((ROOT / "service" / package).rglob("*.py")):
            for line, name in imported_names(path):
                target = service_package_of(name)
                if target is not None and target not in allowed | SHARED | {package}:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {package} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_shared_service_modules_import_no_package():
    # config and exits sit below every package: they may import builders, never the service's packages
    for module in SHARED:
        names = [name for _, name in imported_names(ROOT / "service" / f"{module}.py")]
        assert not [n for n in names if service_package_of(n) not in (None, *SHARED)], module


# A module is one concept (the review's rule); its length is a hint, not a rule: a line count
# met by re-wrapping lines or splitting by size rather than by meaning helps no reader. Past
# LONG a module is named in the test log (pyproject.toml shows the warning, never fails on it),
# past SPRAWL with a stronger word; neither is a cap.
LONG, SPRAWL = 450, 700


def test_long_modules_are_named():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for package in CODE_PACKAGES for p in (ROOT / package).rglob("*.py")}
    for path, n in sorted(sizes.items()):
        if n > SPRAWL:
            warnings.warn(f"{path}: {n} lines; a module is one concept: this holds several, surely",
                          UserWarning, stacklevel=1)
        elif n > LONG:
            warnings.warn(f"{path}: {n} lines; a module is one concept: is it still one?", UserWarning, stacklevel=1)


# A function is one step: what was measured -> what it decides, apart from the writing of it;
# a loop's body, a group of routes or options, its own function. Past LONG_FUNCTION lines a
# function is usually two steps. A soft ratchet: LONG_FUNCTIONS is the count of such functions
# in the service, the runners and the builders today (runners/worker/builtin_models.py's
# builtin); a new one fails here, to be split by meaning (never by re-wrapping lines), and the
# count lowered when one is split.
LONG_FUNCTION, LONG_FUNCTIONS = 60, 1


def long_functions() -> list[str]:
    """``path:line name (n lines)`` of each function over LONG_FUNCTION lines, longest first."""
    found = []
    for package in ("service", "runners", "builders"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > LONG_FUNCTION:
                        found.append((n, f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)"))
    return [line for _, line in sorted(found, reverse=True)]


def test_long_functions_do_not_grow_in_number():
    found = long_functions()
    assert len(found) <= LONG_FUNCTIONS, (
        f"{len(found)} functions over {LONG_FUNCTION} lines (at most {LONG_FUNCTIONS}):\n  " + "\n  ".join(found)
        + "\nsplit the new one by meaning (a step that decides without I/O apart from the one that writes; a "
          "loop's body as its own function), never by re-wrapping lines (docs/architecture.md, \"Layers\")")


# --- No import cycle, and none dodged ------------------------------------------------------
# A cycle between two modules means neither can be read, tested or loaded without the other,
# and an import moved into a function (or below the code, or through importlib) only hides
# one from the reader and from this file. What both sides need goes to a module below them.

# The only function-level imports of abwatch modules, each for start-up time (benchmarks/cli_startup.py):
LAZY_ALLOWED = {
    # the parser needs only the standard library: `abwatch --help` and `--version` answer before
    # the database, statistics and web stacks load (0.09 s of CPU, not over 1 s)
    "service/cli/main.py": "loads service.cli.commands once the arguments are parsed",
    # `abwatch regressions` loads neither the driver, the watch, the web stack nor TVM's runners
    "service/cli/commands.py": "each command imports the machinery it runs when it runs",
    "service/cli/history_command.py": "`abwatch history` imports the read side (NumPy, Otava) when it runs",
    # PEP 562: models import .verdict, and that must not load NumPy and SciPy with .core; its
    # `if TYPE_CHECKING:` block names the same modules, so the cycle test below sees those edges
    "service/stats/__init__.py": "the package's API is resolved on first use",
    # PEP 562 too: every builders module (the config models the parser and the models use) is
    # imported through the package, which must not load GitPython with the builders
    "builders/__init__.py": "the package's API is resolved on first use",
}
CODE_PACKAGES = ("service", "builders", "runners", "core")


def module_of(path: Path, root: Path = ROOT) -> str:
    """``abwatch.service.watch.poll`` for ``service/watch/poll.py`` (``abwatch.runners`` for its ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(["abwatch", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def code_files(root: Path = ROOT, packages: tuple[str, ...] = CODE_PACKAGES) -> dict[str, Path]:
    """Every module of abwatch's code under ``root``, by its name."""
    return {module_of(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _dynamic_target(call: ast.Call) -> str | None:
    """The module an ``importlib.import_module(...)`` or ``__import__(...)`` call names ("?" if
    computed); None for any other call."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__"):
        return None
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else "?"


def imports_of(path: Path, known: dict[str, Path], root: Path = ROOT) -> list[tuple[int, str, str]]:
    """``(line, module, place)`` of every import in ``path``; ``place`` is "module", "type"
    (under ``if TYPE_CHECKING:``), "function" (in a function's body), "late" (at module level
    below a function or class) or "dynamic" (``importlib.import_module``, ``__import__``).
    ``from package import name`` names the submodule where ``name`` is one, else the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_of(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[int, str, str]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
        module = ".".join(base + ([node.module] if node.module else []))
        return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]

    def visit(node: ast.AST, place: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend((node.lineno, target, place) for target in targets(node))
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)) is not None:
            found.append((node.lineno, target, "dynamic"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            place = "function"
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "type")
            for child in node.orelse:
                visit(child, place)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, place)

    below_code = False
    for statement in tree.body:
        visit(statement, "late" if below_code else "module")
        below_code = below_code or isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    return found


def hidden_imports(root: Path = ROOT, allowed: dict[str, str] = LAZY_ALLOWED) -> list[str]:
    """Imports of abwatch modules made in a function, below the code or through importlib,
    outside ``allowed``."""
    known = code_files(root)
    return sorted({f"{path.relative_to(root)}:{line}: imports {target} ({place})"
                   for path in known.values() if str(path.relative_to(root)) not in allowed
                   for line, target, place in imports_of(path, known, root)
                   if place in ("function", "late", "dynamic") and (target == "?" or target.startswith("abwatch"))})


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the abwatch modules it imports: at module level, under ``if TYPE_CHECKING:``
    (a cycle for the type checker is one for the reader), and the allowed lazy imports."""
    known = code_files(root)
    return {name: {target for _, target, place in imports_of(path, known, root)
                   if target in known and target != name and place != "dynamic"} for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_no_import_is_hidden_in_a_function():
    wrong = hidden_imports()
    assert not wrong, "move what both sides need to a module below them:\n" + "\n".join(wrong)


def test_the_lazy_import_allow_list_is_as_small_as_it_can_be():
    known = code_files()
    for file in LAZY_ALLOWED:
        places = {place for _, target, place in imports_of(ROOT / file, known) if target.startswith("abwatch") or target == "?"}
        assert places & {"function", "dynamic"}, f"{file} imports nothing lazily any more: take it off LAZY_ALLOWED"


def test_abwatch_has_no_import_cycle():
    graph = import_graph()
    assert "abwatch.runners.workloads" in graph["abwatch.runners.runner"]  # the graph is not empty
    assert "abwatch.service.store.jobs" in graph["abwatch.service.store.models"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checkers_see_hidden_imports_and_cycles(tmp_path):
    # the two tests above would pass vacuously if imports_of missed the forms that hide an import
    _plant(tmp_path, {
        "service/__init__.py": "",
        "service/a.py": "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    from abwatch.service import b\n"
                        "def f():\n    from abwatch.service.c import x\n    return os\n"
                        "from abwatch.service import d\n",
        "service/b.py": "import importlib\nfrom . import a\nM = importlib.import_module('abwatch.service.d')\n",
        "service/c.py": "class C:\n    def g(self):\n        import abwatch.service.d\n",
        "service/d.py": "x = 1\n",
        "service/ok.py": "from abwatch.service.d import x\n",
    })
    hidden = hidden_imports(tmp_path, allowed={})
    assert sorted(h.split(": ", 1)[1] for h in hidden) == [
        "imports abwatch.service.c (function)", "imports abwatch.service.d (dynamic)",
        "imports abwatch.service.d (function)", "imports abwatch.service.d (late)"], hidden
    assert hidden_imports(tmp_path, allowed={"service/a.py": "", "service/b.py": "", "service/c.py": ""}) == []
    graph = import_graph(tmp_path)
    # b imports a at module level, a imports b for the type checker only: still a cycle
    assert find_cycle(graph) == ["abwatch.service.a", "abwatch.service.b", "abwatch.service.a"]
    assert find_cycle({**graph, "abwatch.service.b": set()}) is None


# --- One module name, one job --------------------------------------------------------------
# A module's file name is what a reader searches for and what a traceback shows: two modules of
# one name in different packages send both to the wrong file. None is repeated (the read side's
# views are named for what they show: artifact_report, ccache_report, device_views; a pull
# request's answer on GitHub is notify/pull_answer; the plug-in interfaces are builder and
# runner); a new repeat fails here unless it is listed, with the reason, below.
REPEATED_NAMES: dict[str, set[str]] = {}


def repeated_module_names(root: Path = ROOT, packages: tuple[str, ...] = CODE_PACKAGES) -> dict[str, set[str]]:
    """File stem -> the folders that hold a module of that name, for stems in more than one."""
    where: dict[str, set[str]] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            if path.stem not in ("__init__", "__main__"):
                where.setdefault(path.stem, set()).add(str(path.parent.relative_to(root)))
    return {stem: folders for stem, folders in where.items() if len(folders) > 1}


def test_no_module_name_is_repeated_for_another_job():
    repeated = repeated_module_names()
    new = {stem: folders for stem, folders in repeated.items() if REPEATED_NAMES.get(stem) != folders}
    assert not new, f"name the new module for its own job (or, if it is one job, put it in one place): {new}"
    gone = sorted(set(REPEATED_NAMES) - set(repeated))
    assert not gone, f"no longer repeated: take {gone} off REPEATED_NAMES"


def test_the_name_checker_sees_a_repeat(tmp_path):
    _plant(tmp_path, {"core/a.py": "", "core/__init__.py": "", "service/__init__.py": "", "service/x/a.py": "",
                      "service/x/__init__.py": "", "builders/b.py": "", "runners/c.py": ""})
    assert repeated_module_names(tmp_path) == {"a": {"core", "service/x"}}


# --- A workload's kind is asked of its kind, not tested for ---------------------------------
# Everything that differs between workload kinds (config model, paths, runners, running,
# output check) is a method of the kind's class (runners/workload_kind.py), found through
# WORKLOAD_KINDS. Code that tests a workload's model or kind itself is a second registry that
# a new kind would have to find and extend; only a kind's own module may (it names its model).

def _is_kind_module(tree: ast.Module) -> bool:
    """Whether the module defines a workload kind (a class whose base is ``WorkloadKind``)."""
    return any(isinstance(node, ast.ClassDef) and any(
        (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "") == "WorkloadKind"
        for b in node.bases) for node in ast.walk(tree))


def _names_in(node: ast.expr) -> list[str]:
    """The class names an isinstance's second argument gives (a name, a tuple, ``A | B``)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Tuple):
        return [n for element in node.elts for n in _names_in(element)]
    if isinstance(node, ast.BinOp):
        return _names_in(node.left) + _names_in(node.right)
    return []


def _is_workload(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == "w" or "workload" in name.lower()


def _is_text(node: ast.expr) -> bool:
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return bool(elements) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elements)


def kind_tests(root: Path = ROOT) -> list[str]:
    """``isinstance(x, ...WorkloadConfig)`` and ``workload.kind == "..."`` outside a kind's module."""
    wrong = []
    for path in code_files(root).values():
        tree = ast.parse(path.read_text(), filename=str(path))
        if _is_kind_module(tree):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2
                    and any(n.endswith("WorkloadConfig") for n in _names_in(node.args[1]))):
                wrong.append(f"{path.relative_to(root)}:{node.lineno}: isinstance on a workload model")
            elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "kind"
                  and _is_workload(node.left.value) and any(_is_text(c) for c in node.comparators)):
                wrong.append(f"{path.relative_to(root)}:{node.lineno}: compares a workload's kind")
    return sorted(wrong)


def test_only_a_kinds_module_asks_which_kind_a_workload_is():
    wrong = kind_tests()
    assert not wrong, "ask WORKLOAD_KINDS[workload.kind] (a method of the kind) instead:\n" + "\n".join(wrong)


def test_the_kind_checker_sees_isinstance_and_kind_comparisons(tmp_path):
    _plant(tmp_path, {
        "service/__init__.py": "",
        "service/a.py": "def f(workload, config):\n"
                        "    if isinstance(workload, TvmWorkloadConfig):\n        return 1\n"
                        "    if isinstance(workload, (spec.CommandWorkloadConfig, int)):\n        return 2\n"
                        "    if any(w.kind == 'command' for w in config.workloads):\n        return 3\n"
                        "    if config.build.kind in ('command', 'tvm-source'):\n        return 4\n"  # a build's: fine
                        "    return workload.kind in ('tvm',) or isinstance(config.build, TvmSourceBuildConfig)\n",
        "runners/mine.py": "class MineKind(WorkloadKind):\n"
                           "    def resolve(self, workload, base_dir):\n"
                           "        return isinstance(workload, MineWorkloadConfig) and workload.kind == 'mine'\n",
    })
    # the build's kind (line 8) and the kind module's own tests (runners/mine.py) are not refused
    assert kind_tests(tmp_path) == sorted([
        "service/a.py:2: isinstance on a workload model", "service/a.py:4: isinstance on a workload model",
        "service/a.py:6: compares a workload's kind", "service/a.py:10: compares a workload's kind"])


# --- Migrations are self-contained ---------------------------------------------------------
# A migration runs, years later, under whatever abwatch is installed: if it imported today's
# code (a hash, a URL mask), an old revision would do something else than it did. What it
# needs is copied into it as it was. Importing an earlier revision is allowed: a revision file
# is frozen once it has been released, so it is as fixed as a copy.

def migration_imports(path: Path) -> list[str]:
    """The abwatch modules (other than an earlier revision) that a migration file imports, anywhere."""
    wrong = []
    for line, target, _ in imports_of(path, {}, path.parents[2]):
        if target == "?" or target.split(".")[0] == "abwatch":
            revision = target.removeprefix("abwatch.migrations.versions.")
            earlier = revision != target and (path.parent / f"{revision}.py").is_file() and revision < path.stem
            if not earlier:
                wrong.append(f"{path.name}:{line}: imports {target}")
    return wrong


def test_migrations_import_no_abwatch_code():
    files = sorted((ROOT / "migrations" / "versions").glob("0*.py"))
    assert len(files) >= 20
    wrong = [problem for path in files for problem in migration_imports(path)]
    assert not wrong, "copy what a migration needs into it:\n" + "\n".join(wrong)


def test_the_migration_checker_sees_an_import_of_abwatch(tmp_path):
    _plant(tmp_path, {
        "migrations/versions/0001_a.py": "x = 1\n",
        "migrations/versions/0002_b.py": "import importlib\nfrom alembic import op\n"
                                         "_0001 = importlib.import_module('abwatch.migrations.versions.0001_a')\n"
                                         "_0003 = importlib.import_module('abwatch.migrations.versions.0003_c')\n"
                                         "def upgrade():\n    from abwatch.service.store.rows import h\n"
                                         "from abwatch.builders import redact\n",
        "migrations/versions/0003_c.py": "x = 1\n",
    })
    assert migration_imports(tmp_path / "migrations" / "versions" / "0002_b.py") == [
        "0002_b.py:4: imports abwatch.migrations.versions.0003_c",  # a later revision is not frozen yet
        "0002_b.py:6: imports abwatch.service.store.rows", "0002_b.py:7: imports abwatch.builders"]
