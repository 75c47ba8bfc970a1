"""Per-function instruction profiles: which functions a counted region spent its instructions
in, and which of them grew from the control to the treatment (pure functions, no abwatch imports
beyond the storable-text rule).

Cachegrind writes one file per process (``cg.<pid>``): a header (``events: Ir``), then for each
source file (``fl=``) and function (``fn=``) lines of ``<line> <Ir>``, and a ``summary:`` line.
C++ names are demangled by cachegrind itself (``--demangle=yes`` is its default), so
``tvm::tir::StmtMutator::VisitStmt(tvm::tir::Stmt const&)`` is read as such. A function's count
is the sum over its lines and files (a static helper of one name in two files is one row).

A region of a TVM worker is counted between two forked marks (``runners/worker/region.py``):
each mark's file holds every count of the process up to it, so the region's profile is the end
mark's counts minus the start mark's, function by function.

Only the :data:`TOP` functions with the most instructions are kept, with the region's total and
the smallest count kept (``floor``): a function missing from a side's kept list ran at most
``floor`` instructions there. :func:`grew` ranks the functions by how many instructions they
gained, the treatment against the control.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abwatch.core.commit_info import storable

TOP = 200  # functions kept per profile: the stored size stays bounded whatever the region ran
SHOWN = 5  # functions a comment or an alert names
GREW_KEPT = 20  # rows of the diff stored (and shown on the regression page)
NO_SYMBOL = "???"  # cachegrind's name for code without a symbol (a stripped library's own functions)
NAME_LIMIT = 2000  # characters of a function's full name kept (templated C++ names run long)
SHORT = 90  # characters of a function's name shown in a table


class ProfileError(ValueError):
    """A cachegrind file that cannot be read as a profile (the message names the file)."""


def read_cg(path: Path) -> dict[str, int]:
    """The instructions (``Ir``) of each function in the cachegrind file ``path``."""
    counts: dict[str, int] = {}
    name = "???"
    try:
        with path.open(errors="replace") as lines:
            for line in lines:
                first = line[:1]
                if first.isdigit():
                    fields = line.split()
                    if len(fields) > 1:
                        counts[name] = counts.get(name, 0) + int(fields[1])
                elif line.startswith("fn="):
                    name = line[3:].rstrip("\n") or "???"
    except OSError as exc:
        raise ProfileError(f"cannot read the profile {path}: {exc}") from None
    except ValueError:
        raise ProfileError(f"{path} is not a cachegrind file (a count line is not a number)") from None
    return counts


def subtract(end: Mapping[str, int], start: Mapping[str, int]) -> dict[str, int]:
    """The counts of a region: ``end``'s minus ``start``'s, for the functions that ran in it."""
    return {name: count - start.get(name, 0) for name, count in end.items() if count > start.get(name, 0)}


def add(profiles: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The counts of several processes together (a command's children, each its own file)."""
    total: dict[str, int] = {}
    for counts in profiles:
        for name, count in counts.items():
            total[name] = total.get(name, 0) + count
    return total


@dataclass(frozen=True)
class Profile:
    """The functions that retired the most instructions in one counted process, largest first.

    ``total``: the instructions of every function; ``seen``: how many functions ran; ``floor``:
    the smallest count kept (0 when every function was kept), the most a function left out ran.
    """

    total: int
    functions: tuple[tuple[str, int], ...]
    seen: int
    floor: int

    def to_dict(self) -> dict[str, Any]:
        """The stored shape (in a comparison's ``instructions`` details)."""
        return {"total": self.total, "seen": self.seen, "floor": self.floor,
                "functions": [{"name": name, "count": count} for name, count in self.functions]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """A stored profile read back (ProfileError naming the key at fault)."""
        try:
            functions = tuple((str(f["name"]), int(f["count"])) for f in data["functions"])
            return cls(int(data["total"]), functions, int(data["seen"]), int(data["floor"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"a stored profile lacks or mistypes {exc}") from None

    def per(self, calls: int) -> Profile:
        """The profile of one of ``calls`` calls (a TVM worker's timed calls are counted together)."""
        if calls <= 1:
            return self
        return Profile(self.total // calls, tuple((n, c // calls) for n, c in self.functions), self.seen,
                       self.floor // calls)


def top(counts: Mapping[str, int], keep: int = TOP) -> Profile:
    """The :class:`Profile` of ``counts``: its ``keep`` largest functions, names made storable."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = tuple((storable(name, NAME_LIMIT), count) for name, count in ranked[:keep])
    floor = kept[-1][1] if len(ranked) > keep else 0
    return Profile(sum(counts.values()), kept, len(ranked), floor)


def _collapse(name: str, opening: str, closing: str, keep: tuple[str, ...] = ()) -> str:
    """``name`` with each outermost ``opening``…``closing`` group emptied to ``opening…closing``
    (``keep``: groups left whole, such as ``(anonymous namespace)``); ``operator<`` and the like
    are not groups."""
    out, depth, start = [], 0, 0
    i = 0
    while i < len(name):
        ch = name[i]
        if depth == 0 and any(name.startswith(k, i) for k in keep):
            word = next(k for k in keep if name.startswith(k, i))
            out.append(word)
            i += len(word)
            continue
        if ch == opening and not name[:i].rstrip().endswith(("operator", "operator<", "operator>", "operator-")):
            if depth == 0:
                out.append(opening)
                start = i
            depth += 1
        elif ch == closing and depth > 0 and not name[:i].rstrip().endswith(("operator", "operator-", "operator>")):
            depth -= 1
            if depth == 0:
                out.append("\u2026" + closing if i > start + 1 else closing)
        elif depth == 0:
            out.append(ch)
        i += 1
    return "".join(out) if depth == 0 else name  # unbalanced: left as it was


def short_name(name: str, width: int = SHORT) -> str:
    """A function's name as a table shows it: template arguments and parameters elided
    (``tvm::runtime::Array<…>::operator[](…) const`` -> ``tvm::runtime::Array<…>::operator[](…)``),
    a leading return type dropped, cut in the middle past ``width`` characters."""
    if name == NO_SYMBOL:
        return "??? (no symbol)"
    text = _collapse(_collapse(name, "<", ">"), "(", ")", keep=("(anonymous namespace)",))
    text = text.removesuffix(" const")
    depth, split = 0, -1
    for i, ch in enumerate(text):  # the last space outside brackets ends a return type
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth -= 1
        elif ch == " " and depth == 0 and not text[:i].endswith("operator"):
            split = i
    text = text[split + 1:] if split >= 0 and text[split + 1:] else text
    if len(text) <= width:
        return text
    head = width // 3
    return text[:head] + "\u2026" + text[len(text) - (width - head - 1):]


def grew(control: Profile, treatment: Profile, keep: int = GREW_KEPT) -> list[dict[str, Any]]:
    """The functions whose instructions grew most from ``control`` to ``treatment``, most first:
    each with its full and short name, both counts (None where the side did not keep it), the
    growth (at least: a count left out is taken as the side's floor) and its percentage, and its
    share of the region's whole change. Functions that did not grow are left out, and so is code
    without a symbol (:func:`unnamed` says how much of the change that was)."""
    a, b = dict(control.functions), dict(treatment.functions)
    a.pop(NO_SYMBOL, None), b.pop(NO_SYMBOL, None)
    change = treatment.total - control.total
    rows: list[dict[str, Any]] = []
    for name in set(a) | set(b):
        before, after = a.get(name), b.get(name)
        delta = (after if after is not None else treatment.floor) - (before if before is not None else control.floor)
        if delta <= 0 or after is None:
            continue
        rows.append({
            "name": name, "short": short_name(name), "control": before, "treatment": after, "change": delta,
            "change_pct": (after / before - 1.0) * 100.0 if before else None,
            "share_pct": delta / change * 100.0 if change > 0 else None,
            "new": before is None and control.floor == 0,  # ran on the treatment's side only
            "at_least": before is None and control.floor > 0,  # the control's count was not kept
        })
    rows.sort(key=lambda row: (-row["change"], row["name"]))
    return rows[:keep]


def unnamed(control: Profile, treatment: Profile) -> dict[str, Any] | None:
    """The instructions of code without a symbol on each side (a release wheel's ``libtvm.so``
    keeps only its exported names: TVM's internal functions and the LLVM inside it are ``???``),
    their change and its share of the region's change; None where neither side kept any."""
    a, b = dict(control.functions).get(NO_SYMBOL), dict(treatment.functions).get(NO_SYMBOL)
    if a is None and b is None:
        return None
    change, whole = (b or 0) - (a or 0), treatment.total - control.total
    return {"control": a, "treatment": b, "change": change, "share_pct": change / whole * 100.0 if whole else None}
