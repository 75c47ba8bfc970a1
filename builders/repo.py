"""The repository driver's git side: a local mirror, ref resolution, clean checkouts.

Every git call goes through GitPython with an argument list; refs, branch names and
commit messages are never put into a shell string.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shutil
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from collections.abc import Iterator

import git
import psutil

from abwatch.core.redact import mask_url
from abwatch.core.file_lock import flocked
from abwatch.core.commit_info import SUMMARY_CHARS, CommitInfo, storable
from abwatch.core.errors import UsageError


_FULL_SHA = re.compile(r"[0-9a-f]{40}")
# The end of a commit's committer line: seconds since 1970 (negative before it, as GitPython
# writes them) and the offset, which git's fsck takes as any sign and four digits (+9959).
_COMMITTER_TIME = re.compile(rb" (-?\d+) ([+-])(\d\d)(\d\d)\s*$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def commit_time(raw: bytes) -> tuple[datetime | None, int | None]:
    """The committer time of a raw commit object: (instant in UTC, offset in minutes).

    Read from the object itself, not GitPython's parse, which reads a date before 1970 as
    1970-01-01 and cannot hold an offset of 24 h or more. (None, None) when the commit has no
    committer time; ValueError or OverflowError for one no Python date can hold (past year 9999).
    """
    for line in raw.split(b"\n\n", 1)[0].split(b"\n"):
        if line.startswith(b"committer "):
            match = _COMMITTER_TIME.search(line)
            if match is None:
                return None, None
            seconds, sign, hours, minutes = match.groups()
            offset = (int(hours) * 60 + int(minutes)) * (-1 if sign == b"-" else 1)
            return _EPOCH + timedelta(seconds=int(seconds)), offset
    return None, None


class RepoError(UsageError):
    """The repository cannot be reached, or a ref does not name a commit in it."""


class RepoMirror:
    """A bare mirror of the watched repository under the cache directory."""

    def __init__(self, url: str, cache_dir: Path) -> None:
        self.url = url
        self.display_url = mask_url(url)  # what errors print and rows store
        # keyed by the masked URL: a stored (masked) URL finds the same mirror again
        digest = hashlib.sha256(self.display_url.encode()).hexdigest()[:16]
        self.path = Path(cache_dir) / "repos" / f"{digest}.git"
        self._repo: git.Repo | None = None

    @property
    def repo(self) -> git.Repo:
        """The mirror, cloned on first use."""
        if self._repo is None:
            self._repo = self._open_or_clone()
        return self._repo

    def locked(self):
        """The mirror's lock (``flock`` on ``{mirror}.lock``, the artifact cache's helper): held
        while it is cloned, fetched or its checkouts are registered, so processes sharing one
        cache directory do not clone into one temporary directory or fetch into one ref at once."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return flocked(self.path.with_suffix(".lock"))

    def _open_or_clone(self) -> git.Repo:
        if (self.path / "HEAD").exists():
            return git.Repo(self.path)
        with self.locked():
            if (self.path / "HEAD").exists():  # another process cloned it while this one waited
                return git.Repo(self.path)
            tmp = self.path.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)  # a clone killed half-way
            try:
                # copies, not hard links, of a local repository's files: the mirror's files are
                # then abwatch's, with its modes; builds clone it as the unprivileged sandbox
                # user, who cannot read a linked 0600 file (a partial clone's ``.promisor``, say)
                git.Repo.clone_from(self.url, tmp, mirror=True, no_hardlinks=True)
            except git.GitCommandError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise RepoError(f"cannot clone repository {self.display_url}: {_stderr(exc)}") from None
            tmp.rename(self.path)
        return git.Repo(self.path)

    def fetch(self) -> None:
        """Bring the mirror up to date with the repository (all branches and tags)."""
        repo = self.repo
        try:
            with self.locked():  # two fetches into one mirror fail on git's ref locks
                repo.git.fetch("--prune", "origin")  # a mirror fetches refs/*
        except git.GitCommandError as exc:
            raise RepoError(f"cannot fetch repository {self.display_url}: {_stderr(exc)}") from None

    def fetch_for(self, ref: str) -> None:
        """Fetch before resolving ``ref``; a full sha already in the mirror needs no fetch.

        Verify re-runs the exact commits of a stored run whose URL was stored masked: the
        repository may not be reachable with it, but the commits are already here.
        """
        try:
            self.fetch()
        except RepoError:
            if not (_FULL_SHA.fullmatch(ref) and (self.path / "HEAD").exists()):
                raise
            try:
                self.repo.git.cat_file("-e", f"{ref}^{{commit}}")
            except git.GitCommandError:
                raise RepoError(f"commit {ref} is not in the mirror of {self.display_url} "
                                "and the repository cannot be fetched") from None

    def _nearest(self, ref: str) -> str:
        """``"; nearest: v1.2, v1.0"``: the tags and branches whose names are closest to ``ref``."""
        try:
            names = self.repo.git.for_each_ref("--format=%(refname:short)", "refs/tags", "refs/heads").split()
        except git.GitCommandError:
            return ""
        close = difflib.get_close_matches(ref, names, n=3, cutoff=0.5)
        return f"; nearest: {', '.join(close)}" if close else ""

    def resolve(self, ref: str) -> CommitInfo:
        """The commit ``ref`` (branch, tag or sha) names; RepoError naming the ref if none."""
        if not ref or ref.startswith("-") or "\0" in ref:
            raise RepoError(f"invalid ref {ref!r}")
        try:
            sha = self.repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
        except git.GitCommandError:
            raise RepoError(f"unknown ref {ref!r} in repository {self.display_url}{self._nearest(ref)}") from None
        commit = self.repo.commit(sha)
        try:  # git writes whatever it is given (hash-object --literally): a date past time_t, say
            when, offset = commit_time(self.repo.odb.stream(commit.binsha).read())
            return CommitInfo(
                sha=commit.hexsha,
                summary=storable(commit.summary, SUMMARY_CHARS),
                author=f"{commit.author.name} <{commit.author.email}>",
                committed_at=when,
                committed_offset_min=offset,
            )
        except (ValueError, OverflowError) as exc:
            raise RepoError(f"commit {sha[:12]} in {self.display_url} cannot be read: {exc}") from None

    def committed_at(self, sha: str) -> datetime | None:
        """The commit time of ``sha`` in UTC, read as :func:`commit_time` reads it (before 1970 too)."""
        return commit_time(self.repo.odb.stream(self.repo.commit(sha).binsha).read())[0]

    def first_parents(self, base: str | None, head: str) -> list[str]:
        """First-parent commits after ``base`` up to ``head``, oldest first."""
        spec = f"{base}..{head}" if base else head
        out = self.repo.git.rev_list("--first-parent", "--reverse", spec)
        return out.split() if out else []

    def is_ancestor(self, old: str, new: str) -> bool:
        """Whether ``old`` is reachable from ``new`` (false also when ``old`` is gone)."""
        try:
            self.repo.git.merge_base("--is-ancestor", old, new)
            return True
        except git.GitCommandError:
            return False

    @contextmanager
    def worktree(self, sha: str, dest: Path) -> Iterator[Path]:
        """A clean, detached checkout of ``sha`` at ``dest``, removed afterwards."""
        repo = self.repo  # opened (or cloned, which takes the lock) before the lock is taken here
        with self.locked():  # prune must not meet another process's checkout half-registered
            repo.git.worktree("prune")  # forget checkouts whose directories are gone (a killed build's)
            repo.git.worktree("add", "--detach", "--force", str(dest), sha)
        try:
            yield dest
        finally:
            shutil.rmtree(dest, ignore_errors=True)
            with self.locked():
                repo.git.worktree("prune")


def remove_stale_checkouts(parent: Path) -> list[Path]:
    """Remove checkout directories ``<pid>-*`` under ``parent`` whose process is gone.

    A build killed with ``kill -9`` cannot clean up after itself; the next build does.
    """
    removed = []
    for path in parent.glob("*-*") if parent.is_dir() else ():
        pid = path.name.partition("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _stderr(exc: git.GitCommandError) -> str:
    text = (exc.stderr or "").strip().removeprefix("stderr:").strip().strip("'").strip() or str(exc)
    # git repeats the URL it was given, credentials included
    return " ".join(mask_url(word) for word in text.split(" "))
