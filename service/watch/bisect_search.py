"""The bisection's search, apart from building and measuring: which commit to test next, and
which commit is each workload's culprit. Plain values; no database, no git, no I/O.

A range is its commits, numbered ``0 .. n-1`` (first parent order, oldest first, the last one
bad); ``-1`` is the good end before them. Workloads still searched together, with their part
of the range, are a :class:`Part`; the search is a stack of parts (:class:`Search`), the part
pushed last taken first. :func:`next_step` takes parts off the stack until one has a commit
left to test, naming the culprits of those that have none; the caller tests that commit
(:func:`service.watch.bisect.find_culprit` builds and compares it) and hands the sides it found
to :func:`judged`, which splits the part by them. One culprit costs at most
:func:`max_builds` builds, plus one per commit that could not be judged and, once one could
not, one more (the search goes on beside the middle: ``tests/test_decisions.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# What a tested commit is for a workload (the values of service.store.models.StepSide): like the
# good end, like the bad end, or not judged (it does not build, hung, crashed, cannot be stored)
BAD, GOOD, SKIP = "bad", "good", "skip"


def max_builds(n: int) -> int:
    """The builds a range of ``n`` commits may take without broken commits: ceil(log2 n) + 1."""
    return max(1, (n - 1).bit_length()) + 1 if n > 1 else 1


@dataclass(frozen=True)
class Part:
    """Workloads still searched together, and their range: commit ``lo`` good, ``hi`` bad; the
    commits between them in ``skipped`` could not be judged for these workloads."""

    names: frozenset[str]
    lo: int
    hi: int
    skipped: frozenset[int] = frozenset()

    def candidates(self) -> list[int]:
        """The commits between the ends still worth testing."""
        return [i for i in range(self.lo + 1, self.hi) if i not in self.skipped]


@dataclass(frozen=True)
class Search:
    """Where a bisection stands: the parts still to search (the last one next), the culprit
    found for each workload (its commit's number), and the workloads left without one because
    the build bound was reached first."""

    todo: tuple[Part, ...]
    culprits: Mapping[str, int] = field(default_factory=dict)
    unresolved: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Probe:
    """A commit to test (``index``) for the workloads of ``part``."""

    part: Part
    index: int


@dataclass(frozen=True)
class Step:
    """What :func:`next_step` decided: the search after it, and the commit to test next, or None
    when the search is over (then ``search.culprits`` is final)."""

    search: Search
    probe: Probe | None


def start(names: Iterable[str], n: int) -> Search:
    """The search of a range of ``n`` commits for ``names``: one part, the whole range."""
    return Search((Part(frozenset(names), -1, n - 1),))


def next_step(search: Search, builds: int, limit: int) -> Step:
    """The next commit to test, after naming the culprit of every part on top of the stack that
    has no commit left to test.

    A part without candidates has found its culprit: its bad end, the first commit known bad
    (next to the good end, or behind only commits that could not be judged, which may hide
    the true one). Once ``builds`` reach ``limit``, a part still holding candidates is left
    without a culprit: a wrong name is worse than none. The commit tested is the candidate
    nearest the middle of the part's range, the earlier one of two as near.
    """
    todo, culprits, unresolved = list(search.todo), dict(search.culprits), set(search.unresolved)
    while todo:
        part = todo.pop()
        candidates = part.candidates()
        if not candidates:
            culprits.update(dict.fromkeys(part.names, part.hi))
        elif builds >= limit:
            unresolved |= part.names
        else:
            middle = (part.lo + part.hi) / 2
            index = min(candidates, key=lambda i: (abs(i - middle), i))
            return Step(Search(tuple(todo), culprits, frozenset(unresolved)), Probe(part, index))
    return Step(Search((), culprits, frozenset(unresolved)), None)


def judged(search: Search, probe: Probe, sides: Mapping[str, str | None]) -> Search:
    """The search once ``probe``'s commit was found ``sides[name]`` (:data:`BAD`, :data:`GOOD` or
    :data:`SKIP`) for each workload of its part.

    The workloads that disagree go on apart: those it was bad for in the range's lower half,
    those it was good for in the upper half, those it could not judge in the same range without
    it. The bad ones are searched first (pushed last), then the good, then the skipped.
    """
    part, index = probe.part, probe.index
    split = {side: frozenset(n for n in part.names if sides[n] == side) for side in (BAD, GOOD, SKIP)}
    pushed = []
    if split[SKIP]:
        pushed.append(Part(split[SKIP], part.lo, part.hi, part.skipped | {index}))
    if split[GOOD]:
        pushed.append(Part(split[GOOD], index, part.hi, part.skipped))
    if split[BAD]:
        pushed.append(Part(split[BAD], part.lo, index, part.skipped))
    return Search((*search.todo, *pushed), search.culprits, search.unresolved)


@dataclass(frozen=True)
class BumpRange:
    """The commits a bisection into a submodule bump tests, oldest first, numbered like a range
    of the branch's commits: the last is the bump's new pin (the bad end, the bump itself), ``-1``
    the bump's parent (the good end, the old pin).

    When the bump changes nothing but the submodule, the parent is the old pin built with the
    bump's files, so the range is the submodule's commits after the old pin. When the bump also
    changes the parent repository's own files, the old pin built at the bump is tested too (it
    comes first): found bad, the culprit is those files, not a submodule commit.
    """

    path: str
    old: str
    commits: tuple[str, ...]
    pure: bool

    def culprit(self, index: int) -> str | None:
        """The submodule commit a search of this range named at ``index``; None when it named the
        old pin at the bump (the bump's own files changed what was measured)."""
        sha = self.commits[index]
        return None if not self.pure and index == 0 else sha


def into_bump(new: str, moved: Sequence[str]) -> bool:
    """Whether a bisection goes on into a submodule bump to ``new`` whose submodule's first-parent
    commits after the old pin are ``moved``: only when they lead to the new pin (a pin moved back,
    or to a side line, leaves no range to search)."""
    return bool(moved) and moved[-1] == new


def bump_range(path: str, old: str, moved: Iterable[str], pure: bool) -> BumpRange:
    """The range of a bump of ``path`` from ``old`` over ``moved`` (the submodule's first-parent
    commits after ``old`` up to the new pin, oldest first); ``pure``: the bump changes no other file."""
    moved = tuple(moved)
    return BumpRange(path, old, moved if pure else (old, *moved), pure)
