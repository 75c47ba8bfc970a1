"""Copies of a build's outputs that never leave the build's directory.

What a build leaves behind is made by code under test: a symbolic link named like the
``artifacts`` directory, a link inside it to a host file, a FIFO, a setuid binary. abwatch copies
it outside the sandbox, with its own privileges, so every copy of a build's outputs goes through
here (the ``command`` builder's ``artifacts``, ``tvm-source``'s libraries, ``python/``, ``keep``
and venv, the artifact cache's ``put`` and ``put_deduplicated``, a ``tvm-wheel`` venv):

- :func:`inside` is a configured path (``artifacts``, a ``keep`` entry) under the build's
  directory; one that is or passes through a symbolic link, or leads outside, is refused
  (:class:`UnsafeArtifact`, naming it: the commit's build fails);
- :func:`copy_tree` and :func:`copy_file` never follow a link: a link whose target stays inside
  the copied tree is kept as a link, one leading outside it (an absolute target, or ``..`` past
  the top) is dropped and said, unless ``allow_link`` admits it (a venv's interpreter); FIFOs,
  sockets and devices are dropped and said; permission bits are kept without setuid, setgid and
  sticky;
- :func:`confine` does the same to a tree built in place (a ``tvm-wheel`` venv).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

LinkRule = Callable[[str, str], bool]  # (path in the tree, link target) -> kept although it leads outside
MODE_BITS = 0o777  # what a copy keeps of a file's mode: no setuid, setgid or sticky bit


class UnsafeArtifact(Exception):
    """A build's output abwatch will not copy (its message names the path and why)."""


def inside(root: Path, rel: str) -> Path:
    """``root / rel``, where ``rel`` is relative, has no ``..``, and no existing component of it
    is a symbolic link (else :class:`UnsafeArtifact`). The path need not exist."""
    if not rel or "\0" in rel or PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
        raise UnsafeArtifact(f"{rel!r} is not a path inside {root}")
    path = Path(root)
    for part in PurePosixPath(rel).parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return Path(root) / rel
        if stat.S_ISLNK(st.st_mode):
            shown = path.relative_to(root)
            raise UnsafeArtifact(f"{rel!r}: {shown} is a symbolic link (to {os.readlink(path)!r}); abwatch copies "
                                 "nothing a build links to, refused")
    return path


def resolved_inside(root: Path, path: Path) -> Path:
    """``path`` (under ``root``, possibly through links) if what it resolves to is inside ``root``,
    else :class:`UnsafeArtifact` naming it (a library that is a link out of the build)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    if real != top and not real.startswith(top + os.sep):
        raise UnsafeArtifact(f"{path} resolves to {real}, outside {root}: refused")
    return path


def venv_interpreter(rel: str, target: str) -> bool:
    """A venv's ``bin/python*`` link to an interpreter: the one link out of an artifact kept
    (the interpreter is this host's; ``Builder.runs_here`` checks it on another)."""
    rel_path, name = PurePosixPath(rel), os.path.basename(target)
    return (rel_path.parent.name == "bin" and re.fullmatch(r"python(\d+(\.\d+)?)?", rel_path.name) is not None
            and re.fullmatch(r"python(\d+(\.\d+)?)?", name) is not None and "\0" not in target)


def link_stays_inside(link: Path, top: Path) -> bool:
    """Whether the symbolic link ``link`` (in the tree ``top``) has a relative target that,
    followed through every link on the way, stays inside ``top``."""
    target = os.readlink(link)
    if os.path.isabs(target):
        return False
    real, root = os.path.realpath(link), os.path.realpath(top)
    return real == root or real.startswith(root + os.sep)


def copy_file(source: Path, target: Path, said: list[str] | None = None) -> None:
    """Copy the regular file ``source`` (never a link) to ``target``, its mode without setuid,
    setgid or sticky (said in ``said`` when that dropped something)."""
    st = os.lstat(source)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeArtifact(f"{source} is not a regular file ({_kind(st.st_mode)}): refused")
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(target, st.st_mode & MODE_BITS)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    if st.st_mode & ~MODE_BITS & 0o7777 and said is not None:
        said.append(f"note: {source.name}: setuid, setgid and sticky bits dropped from its copy\n")


def copy_tree(source: Path, target: Path, *, allow_link: LinkRule | None = None,
              ignore: Iterable[str] = (), said: list[str] | None = None) -> list[str]:
    """Copy the directory ``source`` (itself no link) to ``target`` without following links (see
    the module); what was dropped, one line each (also appended to ``said``)."""
    st = os.lstat(source)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeArtifact(f"{source} is a symbolic link (to {os.readlink(source)!r}): refused")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeArtifact(f"{source} is not a directory ({_kind(st.st_mode)}): refused")
    notes: list[str] = []
    _copy_dir(Path(source), Path(target), Path(source), allow_link, tuple(ignore), notes)
    if said is not None:
        said.extend(notes)
    return notes


def _copy_dir(source: Path, target: Path, top: Path, allow_link: LinkRule | None, ignore: tuple[str, ...],
              notes: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with os.scandir(source) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if any(fnmatch.fnmatch(entry.name, pattern) for pattern in ignore):
            continue
        path, dest = Path(entry.path), target / entry.name
        rel = str(path.relative_to(top))
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            link = os.readlink(path)
            if link_stays_inside(path, top) or (allow_link is not None and allow_link(rel, link)):
                os.symlink(link, dest)
            else:
                notes.append(f"note: dropped the symbolic link {rel} -> {link}: it leads outside the artifact\n")
        elif stat.S_ISDIR(mode):
            _copy_dir(path, dest, top, allow_link, ignore, notes)
            os.chmod(dest, entry.stat(follow_symlinks=False).st_mode & MODE_BITS)
        elif stat.S_ISREG(mode):
            copy_file(path, dest, notes)
        else:
            notes.append(f"note: dropped {rel}: a {_kind(mode)}, not a file, directory or link\n")


def confine(root: Path, allow_link: LinkRule | None = None) -> list[str]:
    """Make the tree ``root`` (built in place) what :func:`copy_tree` would have copied: links
    leading outside it and special files removed, setuid, setgid and sticky bits cleared; what
    was done, one line each."""
    notes = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel, st = str(path.relative_to(root)), os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                link = os.readlink(path)
                if not link_stays_inside(path, root) and not (allow_link is not None and allow_link(rel, link)):
                    path.unlink()
                    notes.append(f"note: dropped the symbolic link {rel} -> {link}: it leads outside the artifact\n")
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                path.unlink()
                notes.append(f"note: dropped {rel}: a {_kind(st.st_mode)}, not a file, directory or link\n")
            elif st.st_mode & ~MODE_BITS & 0o7777:
                os.chmod(path, st.st_mode & MODE_BITS)
                notes.append(f"note: {rel}: setuid, setgid and sticky bits cleared\n")
    return notes


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"
