"""The layers' arrows run one way: service -> runners -> builders (builders.spec at the bottom).

Builders and runners are plug-ins the service drives; if they imported the service, a new
builder could not be written, tested or run (a watch worker, a board agent) without the
database, the API and the whole CLI coming along.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package folder -> the abwatch packages its modules must not import
FORBIDDEN = {
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


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_an_upper_layer(package):
    files = modules_of(package)
    assert len(files) >= 5, f"found only {files} in {package}/"
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in files for line, name in imported_names(path)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[package])
    ]
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


def test_importing_builders_and_runners_loads_no_service_module():
    # transitively too: a fresh interpreter imports every builder and runner module
    # (tvm_worker is a script run inside a build's own Python, checked by the AST test only)
    modules = [f"abwatch.{package}.{path.stem}" for package in FORBIDDEN for path in modules_of(package)
               if path.stem not in ("__init__", "tvm_worker")]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.service')))\n"
            "print(sorted(m for m in sys.modules if m.startswith('abwatch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]", f"builders/runners pulled in {out[0]}"
    assert "abwatch.builders.spec" in out[1] and "abwatch.runners.cpu" in out[1]


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


def test_no_service_module_is_a_sprawl():
    # a module a newcomer can read in one sitting; the largest today are about 400 lines
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "service").rglob("*.py")}
    assert not {p: n for p, n in sizes.items() if n > 450}, sizes
