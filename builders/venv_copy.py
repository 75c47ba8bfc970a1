"""A venv copied into an artifact so that it runs from wherever the artifact is.

A venv made by ``python -m venv`` is nearly relocatable: ``bin/python`` is a symbolic link to the
system interpreter and ``pyvenv.cfg``'s ``home`` names that interpreter's directory (the same on
every host with the same toolchain), and Python finds the venv from the path it was started by.
What names the venv's own path is fixed here: ``pyvenv.cfg``'s ``command`` line (informational)
is dropped, so are the ``activate`` scripts, the ``#!`` line of each script in ``bin/`` becomes one that starts the ``python``
beside the script, and a ``.pth`` line naming a directory in the venv becomes relative to
its ``site-packages``. What names the build host outside the venv — a ``.pth`` line or an
editable install's finder pointing at a local package directory — cannot travel: it is
returned, and the artifact is kept on its host (``TvmSourceBuilder.portable``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from abwatch.builders.safe_copy import copy_tree, venv_interpreter

# starts the python beside the script, wherever the venv is (sh runs the first two lines; for
# Python they are a string): the form pip writes for interpreters on too long a path
RELATIVE_SHEBANG = "#!/bin/sh\n'''exec' \"$(dirname -- \"$0\")/python\" \"$0\" \"$@\"\n' '''\n"
# abwatch never activates a build's venv (build_environment sets PATH and VIRTUAL_ENV), and the
# activate scripts name the venv's path: not copied
ACTIVATE = ("activate", "activate.*", "Activate.ps1")


def copy_venv(source: Path, target: Path, said: list[str] | None = None) -> list[str]:
    """Copy the venv ``source`` to ``target`` (without byte code and abwatch's own marker files),
    made independent of ``source``'s path; the paths of the build host outside the venv that
    its imports still need (empty when the copy works on any host with the same interpreter).
    No link is followed; one leading out of the venv is dropped (said in ``said``), but for
    ``bin/python*`` to the interpreter (:func:`builders.safe_copy.copy_tree`)."""
    copy_tree(source, target, allow_link=venv_interpreter, ignore=("__pycache__", "*.pyc", ".abwatch-*", *ACTIVATE),
              said=said)
    old = str(source.resolve())
    cfg = target / "pyvenv.cfg"
    if cfg.is_file():
        cfg.write_text("".join(line for line in cfg.read_text().splitlines(keepends=True)
                               if not line.startswith("command =")))
    for script in sorted((target / "bin").iterdir()):
        if script.is_symlink() or not script.is_file():
            continue  # the interpreter's links
        _relative_shebang(script, old)
    host_paths: list[str] = []
    for site in target.glob("lib*/python*/site-packages"):
        if site.parent.parent.is_symlink():
            continue  # lib64 -> lib: the same directory
        for pth in sorted(site.glob("*.pth")):
            host_paths += _relative_pth(pth, site, old, str(source))
        # setuptools' editable installs map packages to their source directory in a finder module
        host_paths += [str(finder.relative_to(target)) for finder in sorted(site.glob("__editable__*finder.py"))]
    return host_paths


def _relative_shebang(script: Path, old: str) -> None:
    try:
        text = script.read_text()
    except (UnicodeDecodeError, OSError):
        return  # a binary: not a script
    first, _, rest = text.partition("\n")
    if first.startswith("#!") and "/bin/python" in first and old in first:
        mode = script.stat().st_mode
        script.write_text(RELATIVE_SHEBANG + rest)
        os.chmod(script, mode)


def _relative_pth(pth: Path, site: Path, old: str, unresolved: str) -> list[str]:
    """Rewrite ``pth``'s lines naming a directory of the old venv relative to ``site``; the lines
    naming anything else on the build host (absolute paths, or code mentioning the old venv)."""
    lines, outside, changed = [], [], False
    old_site = Path(old) / site.relative_to(site.parents[2])
    for line in pth.read_text().splitlines(keepends=True):
        text = line.strip()
        if text.startswith("import"):
            if old in text or unresolved in text:
                outside.append(f"{pth.name}: {text[:200]}")
        elif text.startswith("/"):
            inside = next((base for base in (old, unresolved) if text == base or text.startswith(base + "/")), None)
            if inside is None:
                outside.append(f"{pth.name}: {text}")
            else:
                line = os.path.relpath(Path(old) / Path(text).relative_to(inside), old_site) + "\n"
                changed = True
        lines.append(line)
    if changed:
        pth.write_text("".join(lines))
    return outside


def interpreter_problem(venv: Path, timeout_s: float = 30.0) -> str | None:
    """Why the copied ``venv`` cannot run on this host, or None.

    Its ``bin/python`` links to the build host's interpreter, and its ``site-packages`` (compiled
    extensions included) is for that interpreter's ``X.Y``: the interpreter must be at the same
    path here, with the same version (``pyvenv.cfg``'s ``version``). The artifact key does not
    name the interpreter, so a host with another one finds the artifact yet cannot use it.
    """
    python = venv / "bin" / "python"
    target = Path(os.path.realpath(python))
    if not target.is_file():
        return f"its interpreter {os.readlink(python) if python.is_symlink() else python} is not on this host"
    wanted = _cfg_version(venv / "pyvenv.cfg")
    try:
        out = subprocess.run([str(target), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"its interpreter {target} does not start here ({exc})"
    have = out.stdout.strip()
    if out.returncode != 0 or not have:
        return f"its interpreter {target} does not start here (status {out.returncode})"
    if wanted is not None and have != wanted:
        return f"it was built for Python {wanted}; {target} here is Python {have}"
    return None


def _cfg_version(cfg: Path) -> str | None:
    """``X.Y`` of ``pyvenv.cfg``'s ``version`` (``version_info`` in newer venvs), or None."""
    try:
        lines = cfg.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition("=")
        if name.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:2]) or None
    return None
