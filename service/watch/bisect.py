"""Bisection: name the commit that caused a confirmed regression.

The search (which commit next, which is the culprit) is :mod:`service.watch.bisect_search`;
this module builds and compares the commits it asks for and records the steps, the culprits,
their alerts and commit statuses.

The range is the first-parent commits after the regressions' control (good) up to their
treatment (bad). Each step A/B-tests the commit nearest the middle against the good end
through :func:`~service.compare.driver.run_compare` (run type ``regress``, so no new regressions
are opened); when that comparison cannot decide, the same commit is compared with the bad
end (both builds are cached by then, so it costs no build). A commit that does not build, or
whose benchmark hangs or crashes, is skipped (``git bisect skip``) and the next one nearest
the middle is tried; a hung commit is never named culprit for hanging.

Several workloads confirmed by one verify run are bisected together while they agree; when
a step finds some of them slower and others not, they have different culprits, and each
part goes on in its own half of the range. One culprit costs at most ceil(log2 N) + 1 builds
(plus one per broken commit, and one more once there is one); each further culprit in the range only the builds its own
half still needs. Every step is a :class:`~service.store.models.BisectionStep` of each regression
it judged; the culprit and the group (regressions with the same culprit on one device) are
stored on each regression.

What "slower" means is the regression's kind and the metric that opened it: each step is judged
by the verdict :data:`JUDGES` names for them, read through the metric registry
(:func:`service.compare.metrics.judged`) — for ``runtime`` the run's verdict on that metric (time,
instructions, CPU time, peak memory), for ``compile-time`` the compile's. The engine is the same;
only the verdict it reads differs.

When a culprit moves a submodule the build checks out (a ``[build] submodules`` entry, TVM's
``3rdparty/tvm-ffi`` first) and its parent was found good, the bisection goes on into the
bump (:func:`_into_submodule`): the submodule's first-parent commits between the two pins,
each built as TVM at the culprit with the submodule moved to it (``Builder.pin_submodule``; its
own cache key and build row), compared with the culprit's parent. A bump that changes nothing
else is the parent's tree with the new pin, so a step undecided against the parent is compared
with the bump built as the parent with the submodule moved; a bump that also changes TVM's files
tests the old pin at the bump first, which names those files when it is slower already. The
submodule commit is stored beside the culprit (``regressions.culprit_submodule_*``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection

from sqlalchemy import func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

import git

from abwatch.core.commit_info import CommitInfo, storable
from abwatch.builders import make_builder
from abwatch.builders.builder import SubmodulePin
from abwatch.builders.repo import RepoError, RepoMirror
from abwatch.service import stats
from abwatch.service.compare import driver, lifecycle, metrics, outcome
from abwatch.service.notify import alerts, culprit_comment, github
from abwatch.service.config import Config
from abwatch.service.stats.verdict import Direction, Metric, RegressionKind
from abwatch.service.store.models import (
    BisectionStep, Commit, Regression, Repository, RunType, StepSide, StepVerdict,
)
from abwatch.service.store.rows import get_commit, get_repository
from abwatch.service.watch import bisect_search
from abwatch.service.watch.bisect_search import BAD, GOOD, SKIP

# A step's verdict of one workload, and why it could not be judged (None when it could).
Judge = Callable[[outcome.WorkloadResult], tuple[stats.Verdict, str | None]]


def _reading(kind: RegressionKind, metric: Metric) -> Judge:
    """The verdict of ``metric`` in phase ``kind`` of each step's result."""
    return functools.partial(metrics.judged, phase=kind, metric=metric)


# What bisection (and a fix's check) judges a regression by: its kind's verdict on the metric that
# opened it, for every metric of the registry. A correctness regression is not bisected.
BISECTED_KINDS = sorted((RegressionKind.RUNTIME, RegressionKind.COMPILE_TIME))
JUDGES: dict[tuple[RegressionKind, Metric], Judge] = {
    (kind, metric.metric): _reading(kind, metric.metric) for kind in BISECTED_KINDS for metric in metrics.METRICS.values()}


def directions(config: Config) -> list[Direction]:
    """The directions of the confirmed changes ``[watch] bisect`` bisects ("regression": slower,
    "improvement": faster)."""
    return [d for d, name in ((Direction.SLOWER, "regression"), (Direction.FASTER, "improvement"))
            if name in config.watch.bisect]


def inverted(judge: Judge) -> Judge:
    """``judge`` with an improvement read as the change sought: a step of an improvement's
    bisection is bad (at or after its cause) when it is faster than the good end."""
    swap = {stats.Outcome.REGRESSION: stats.Outcome.IMPROVEMENT, stats.Outcome.IMPROVEMENT: stats.Outcome.REGRESSION}

    def read(result: outcome.WorkloadResult) -> tuple[stats.Verdict, str | None]:
        v, failure = judge(result)
        return dataclasses.replace(v, verdict=swap.get(v.verdict, v.verdict)), failure
    return read


def judge_of(regression: Regression) -> Judge:
    """What judges a step for ``regression``: its kind's verdict, on the metric that opened it
    (inverted for a confirmed improvement: the change sought is faster)."""
    judge = JUDGES[(regression.kind, regression.metric)]
    return inverted(judge) if regression.direction is Direction.FASTER else judge


def _sides(outcome: outcome.CompareOutcome, names: Collection[str], good_is_control: bool,
           judge: Judge = JUDGES[(RegressionKind.RUNTIME, Metric.TIME)]) -> dict[str, tuple]:
    """Per workload: good, bad or None (undecided), with its verdict (as ``judge`` reads it) and change."""
    found: dict[str, tuple] = {}
    for r in outcome.results:
        if r.workload not in names:
            continue
        v, failure = judge(r)
        if failure:  # hung or crashed at the tried commit: it cannot be judged, like a broken build
            found[r.workload] = (SKIP, "failed", None)
            continue
        slower = v.verdict == stats.Outcome.REGRESSION
        undecided = v.verdict == stats.Outcome.UNKNOWN
        if good_is_control:  # the tried commit is the treatment against the good end
            side = BAD if slower else (None if undecided else GOOD)
        else:  # against the bad end (the tried commit is the control): the bad end slower means good
            side = GOOD if slower else (None if undecided else BAD)
        found[r.workload] = (side, v.verdict.value, v.change_pct)
    return found


def find_culprit(session: Session, config: Config, mirror: RepoMirror, regressions: list[Regression],
                 parent_run_id: int, progress: driver.Progress | None = None,
                 judge: Judge | None = None, good: str | None = None) -> dict[str, str]:
    """Bisect the range of ``regressions`` (one verify run's confirmed ones, all of one kind).

    Each step is judged by ``judge`` (default: :data:`JUDGES` of the regressions' kind) against
    the good end ``good`` (default: the regressions' control; the watch gives a later one for a
    slowdown beyond an earlier regression against a pinned base). The search itself
    (:mod:`service.watch.bisect_search`) says which commit to test next; this builds, compares
    and records what it asks, then names the culprits.
    Returns ``{workload: culprit sha}`` for the workloads whose culprit was found.
    """
    progress = progress or driver.NullProgress()
    judge = judge if judge is not None else _common_judge(regressions)
    first = regressions[0]
    good, bad = good or first.control_commit.sha, first.treatment_commit.sha
    commits = mirror.first_parents(good, bad)
    if not commits or commits[-1] != bad:  # not on one first-parent line (e.g. a fixed: control)
        commits = [bad]
    by_name = {r.workload.name: r for r in regressions}
    tester = _Tester(session, config, mirror, by_name, parent_run_id, progress, judge, (good, bad))
    progress.message(f"bisecting {len(commits)} commit(s) {good[:12]}..{bad[:12]} for {sorted(by_name)}")
    search, builds, limit = bisect_search.start(by_name, len(commits)), 0, config.watch.max_builds_per_range
    while (step := bisect_search.next_step(search, builds, limit)).probe is not None:
        names = step.probe.part.names
        found, built = tester.test(names, commits[step.probe.index])
        builds += built
        search = bisect_search.judged(step.search, step.probe, {name: found[name][0] for name in names})
    culprits = {name: commits[index] for name, index in step.search.culprits.items()}
    for sha in sorted(set(culprits.values())):
        named = frozenset(n for n, c in culprits.items() if c == sha)
        index = commits.index(sha)
        parent_good = (index == 0 and mirror.first_parents(good, sha) == [sha]) or _found_good(
            session, [by_name[n] for n in named], commits[index - 1] if index else good)
        if parent_good:  # the change reproduces between the culprit's parent and the culprit
            _into_submodule(session, config, mirror, tester, named, sha, progress)
    _announce(session, config, mirror, by_name, culprits, parent_run_id, one_commit=len(commits) == 1)
    return culprits


def _common_judge(regressions: list[Regression]) -> Judge:
    """The judge of ``regressions``, which must share their kind and metric to be bisected together."""
    first = regressions[0]
    if {(r.kind, r.metric, r.direction) for r in regressions} != {(first.kind, first.metric, first.direction)} \
            or (first.kind, first.metric) not in JUDGES:
        raise ValueError("cannot bisect regressions of kinds "
                         f"{sorted({(r.kind.value, r.metric.value, r.direction.value) for r in regressions})} together")
    return judge_of(first)


class _Tester:
    """Tests commits of one bisection for some of its workloads, storing each step as it is
    judged (a bisection taken up again reads them instead of comparing again)."""

    def __init__(self, session: Session, config: Config, mirror: RepoMirror, by_name: dict[str, Regression],
                 parent_run_id: int, progress: driver.Progress, judge: Judge, ends: tuple[str, str]) -> None:
        self.session, self.mirror, self.by_name, self.progress, self.judge = session, mirror, by_name, progress, judge
        self.parent_run_id, (self.good, self.bad) = parent_run_id, ends
        # each step compares with the verify run's own config, its workloads narrowed to the part's
        self.base_config = Config.model_validate(session.get_one(driver.Run, parent_run_id).config)
        self.repository = get_repository(session, config.repository.url)
        self.positions = {r.id: session.scalar(select(func.count()).select_from(BisectionStep)
                                               .where(BisectionStep.regression_id == r.id)) or 0
                          for r in by_name.values()}

    def test(self, names: frozenset[str], sha: str, moved: _Moved | None = None) -> tuple[dict[str, tuple], int]:
        """Per workload of ``names``: (side, verdict, change) at commit ``sha`` (with a submodule
        moved: ``moved``); and the builds it took."""
        session, builds = self.session, 0
        commit, unreadable = commit_row(session, self.repository, self.mirror, sha)
        sub_id = moved.commit.id if moved else None
        found = _stored_steps(session, [self.by_name[name] for name in names], commit.id, sub_id)
        if found is not None:  # stepped before this process was killed: the verdict is kept
            self.progress.message(f"  {sha[:12]}: judged already (stored steps); not compared again")
        elif unreadable:  # no comparison can store it: skipped like a broken build
            self.progress.message(f"  {sha[:12]}: skip (cannot be read or stored: {unreadable})")
            found = _skip_unreadable(session, [self.by_name[name] for name in sorted(names)], self.positions,
                                     commit, unreadable)
        else:
            if moved is None:
                found, deciding, step_run = _judge(names, sha, self.good, self.bad, self._compare, self.judge)
            else:  # against the bump's parent, the bump with the submodule moved (see _into_submodule)
                found, deciding, step_run = _judge(names, sha, moved.parent, sha, moved.compare(self._compare),
                                                   self.judge)
            builds = sum(1 for b in step_run.builds if not b.cached)
            for name in sorted(names):
                side, value, change = found[name]
                regression = self.by_name[name]
                session.add(BisectionStep(regression_id=regression.id, position=self.positions[regression.id],
                                          commit_id=commit.id, submodule_commit_id=sub_id, run_id=deciding[name],
                                          verdict=StepVerdict(value), side=StepSide(side), change_pct=change))
                self.positions[regression.id] += 1
            session.commit()
        _say(self.progress, sha[:12] if moved is None else f"{sha[:12]} with {moved.pin.path} at {moved.pin.sha[:12]}",
             names, found)
        return found, builds

    def _compare(self, names: Collection[str], control: str, treatment: str,
                 pin: tuple[str, SubmodulePin] | None = None) -> outcome.CompareOutcome:
        """Compare ``control`` with ``treatment`` for ``names``; ``pin``: (commit, submodule
        moved) of one side, built locally (a build host would build the commit as it records)."""
        run_config = self.base_config.model_copy(update={
            "workloads": [w for w in self.base_config.workloads if w.name in names],
            "run": self.base_config.run.model_copy(update={"seed": None})})
        builder = None
        if pin is not None:
            builder = make_builder(run_config)
            builder.store = None
            builder.pin_submodule(*pin)
        return driver.run_compare(self.session, run_config, control, treatment, run_type=RunType.REGRESS,
                                  parent_run_id=self.parent_run_id, progress=self.progress, builder=builder)


@dataclasses.dataclass(frozen=True)
class _Moved:
    """A step of a bisection into a bump: the bump ``sha`` built with ``pin``, compared with the
    bump's ``parent``; ``pure``: the bump changes nothing but the submodule."""

    pin: SubmodulePin
    commit: Commit  # the submodule commit's row
    parent: str
    pure: bool

    def compare(self, compare: Callable[..., outcome.CompareOutcome]) -> Callable[..., outcome.CompareOutcome | None]:
        """``_judge``'s comparison: against the parent, the bump with the submodule moved; undecided,
        against the bump, the parent with it moved (the same tree when the bump is pure; a bump
        that changes TVM's files has no such build: the step is left undecided, as the earlier)."""
        def step(names: Collection[str], control: str, treatment: str) -> outcome.CompareOutcome | None:
            if control == self.parent:
                return compare(names, control, treatment, (treatment, self.pin))
            return compare(names, self.parent, treatment, (self.parent, self.pin)) if self.pure else None
        return step


def _say(progress: driver.Progress, label: str, names: frozenset[str], found: dict[str, tuple]) -> None:
    """Tell what the commit ``label`` names was found for each workload of ``names``."""
    by_side = {side: sorted(n for n in names if found[n][0] == side) for side in (BAD, GOOD, SKIP)}
    broken = all(found[n][1] == "build_failed" for n in names)
    progress.message(f"  {label}: " + ("skip (does not build)" if broken else
                                          f"bad for {by_side[BAD]}, good for {by_side[GOOD]}"
                                          + (f", cannot run {by_side[SKIP]}" if by_side[SKIP] else "")))


def _announce(session: Session, config: Config, mirror: RepoMirror, by_name: dict[str, Regression],
              culprits: dict[str, str], parent_run_id: int, one_commit: bool) -> None:
    """Store each culprit on its regressions and tell of it: an alert, a comment on the pull request
    that merged it, and a failed commit status."""
    for sha in sorted(set(culprits.values())):
        named = [by_name[n] for n, c in culprits.items() if c == sha]
        name_culprit(session, named, mirror, sha)
        ids = [r.id for r in named]
        # the pull request that merged the culprit is told, with the alert (the same transaction)
        culprit_comment.enqueue(session, named, config.github, config.alerts.dashboard_url)
        if named[0].direction is Direction.FASTER:  # an improvement: its cause told, no failed status
            alerts.enqueue(session, ids, "culprit", config.alerts)
            continue
        # a one-commit range: the `regress` alert, if still unsent, names the culprit itself;
        # otherwise a `culprit` alert, recorded with it (the outbox) and sent after the job
        told = alerts.refresh_pending(session, ids, "regress", config.alerts) if one_commit else set()
        alerts.enqueue(session, [i for i in ids if i not in told], "culprit", config.alerts)
        device = named[0].device.name if named[0].device else config.runner.device or "?"
        # the submodule commit first when the bisection went on into the bump: the description is short
        into = sorted({f"{r.culprit_submodule_path} {r.culprit_submodule_commit.sha[:12]}: " for r in named
                       if r.culprit_submodule_commit is not None})
        github.enqueue(session, config.github, sha, "failure", device,
                       "".join(into) + "culprit of "
                       + ", ".join(f"#{r.id} {r.workload.name} {r.change_pct:+.1f}%" for r in named),
                       github.run_url(config.alerts.dashboard_url, parent_run_id))
    session.commit()


def _judge(names: frozenset[str], sha: str, good: str, bad: str,
           compare: Callable[[Collection[str], str, str], outcome.CompareOutcome | None],
           judge: Judge) -> tuple[dict[str, tuple], dict[str, int], outcome.CompareOutcome]:
    """One step: ``sha`` against the good end; the workloads it cannot tell apart against the
    bad end (no build: both are cached by then). Returns {workload: (side, verdict, change)},
    {workload: the run that decided it}, and the comparison against the good end. ``compare``
    may answer None against the bad end (no such build): the step is then the earlier suspect."""
    result = compare(names, good, sha)
    if result is None:  # only the comparison against the bad end may have no build to make
        raise ValueError(f"no comparison of {sha[:12]} with the good end {good[:12]}")
    deciding = dict.fromkeys(names, result.run_id)
    if result.status == "build_failed":
        return {name: (SKIP, "build_failed", None) for name in names}, deciding, result
    found = _sides(result, names, good_is_control=True, judge=judge)
    found.update({name: (None, "unknown", None) for name in names - set(found)})
    undecided = frozenset(name for name in names if found[name][0] is None)
    if undecided:
        against_bad = compare(undecided, sha, bad)
        again = {} if against_bad is None else _sides(against_bad, undecided, good_is_control=False, judge=judge)
        for name in undecided:
            side, value, change = again.get(name, (None, "unknown", None))
            # neither end tells them apart: keep the earlier commit as the suspect
            found[name] = (side or BAD, value, change)
            if against_bad is not None:
                deciding[name] = against_bad.run_id
    return found, deciding, result


def _skip_unreadable(session: Session, regressions: list[Regression], positions: dict[int, int], commit: Commit,
                     why: str) -> dict[str, tuple]:
    """A skip step (no run) on each of ``regressions`` for a commit no comparison can store, and a
    note saying why; the sides, as :func:`_sides` gives them."""
    for regression in regressions:
        session.add(BisectionStep(regression_id=regression.id, position=positions[regression.id],
                                  commit_id=commit.id, run_id=None, verdict=StepVerdict.FAILED,
                                  side=StepSide.SKIP, change_pct=None))
        positions[regression.id] += 1
        lifecycle.note(session, regression, None,
                       f"bisection skipped {commit.sha[:12]}: it cannot be read or stored ({why})")
    session.commit()
    return {r.workload.name: (SKIP, StepVerdict.FAILED.value, None) for r in regressions}


def _stored_steps(session: Session, regressions: list[Regression], commit_id: int,
                  submodule_commit_id: int | None = None) -> dict[str, tuple] | None:
    """The sides stored for ``commit_id`` by an earlier bisection of ``regressions`` (one that
    was killed, say), as :func:`_sides` gives them; None unless every one of them has a step.

    A step is committed as soon as it is judged, so a bisection taken up again goes on from
    the stored steps instead of comparing (and storing) the same commit twice.
    """
    found = {}
    for regression in regressions:
        step = session.scalars(select(BisectionStep).where(
            BisectionStep.regression_id == regression.id, BisectionStep.commit_id == commit_id,
            BisectionStep.submodule_commit_id.is_(None) if submodule_commit_id is None
            else BisectionStep.submodule_commit_id == submodule_commit_id)
            .order_by(BisectionStep.position.desc())).first()
        if step is None:
            return None
        found[regression.workload.name] = (step.side.value, step.verdict.value, step.change_pct)
    return found


def commit_row(session: Session, repository: Repository, mirror: RepoMirror, sha: str) -> tuple[Commit, str | None]:
    """The row of commit ``sha``, and why it could not be read or stored whole (None when it could).

    A commit git accepts may still be one no database or Python date can hold (a time past
    year 9999, say): it is stored by its sha alone, and the caller skips it.
    """
    try:
        with session.begin_nested():
            return get_commit(session, repository, mirror.resolve(sha)), None
    except (RepoError, ValueError, OverflowError, SQLAlchemyError) as exc:
        reason = storable(f"{type(exc).__name__}: {exc}", 500)
    with session.begin_nested():
        return get_commit(session, repository, CommitInfo(sha=sha, summary="", author="", committed_at=None)), reason


def name_culprit(session: Session, regressions: list[Regression], mirror: RepoMirror, sha: str) -> None:
    """Store ``sha`` as the culprit of ``regressions`` and group them with others of the same culprit."""
    repository = get_repository(session, regressions[0].control_commit.repository.url)
    commit, _ = commit_row(session, repository, mirror, sha)
    for regression in regressions:
        regression.culprit_commit = commit
    session.flush()
    for device_id in {r.device_id for r in regressions}:
        same = (Regression.culprit_commit_id == commit.id, Regression.device_id == device_id)
        group = session.scalar(select(func.min(Regression.id)).where(*same))
        session.execute(update(Regression).where(*same).values(group_id=group))
    session.flush()


def _found_good(session: Session, regressions: list[Regression], sha: str) -> bool:
    """Whether a stored step found commit ``sha`` good for every one of ``regressions``."""
    for regression in regressions:
        sides = session.scalars(select(BisectionStep.side).join(Commit, BisectionStep.commit_id == Commit.id).where(
            BisectionStep.regression_id == regression.id, Commit.sha == sha,
            BisectionStep.submodule_commit_id.is_(None)))
        if StepSide.GOOD not in set(sides):
            return False
    return True


@dataclasses.dataclass(frozen=True)
class Bump:
    """What commit ``sha`` does to submodule ``path``: its pin before (``old``) and after
    (``new``), the URL ``.gitmodules`` gives it, and whether the commit changes other files too."""

    path: str
    old: str
    new: str
    url: str
    pure: bool


def bumps(mirror: RepoMirror, sha: str, paths: Collection[str]) -> list[Bump]:
    """The submodules of ``paths`` that commit ``sha`` moves (read from git: gitlinks and
    ``.gitmodules`` of ``sha`` and its first parent)."""
    if not paths:
        return []
    repo = mirror.repo.git
    try:
        def pins(rev: str) -> dict[str, str]:
            out = repo.ls_tree(rev, "--", *paths)
            return {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines()
                    if line.split()[1] == "commit"}
        before, after = pins(f"{sha}^"), pins(sha)
        changed = set(repo.diff("--name-only", f"{sha}^", sha).split())
        names = repo.config("--blob", f"{sha}:.gitmodules", "--get-regexp", r"^submodule\..*\.path$")
    except git.GitCommandError:  # a root commit, no .gitmodules: nothing to go into
        return []
    found = []
    for line in names.splitlines():
        key, _, path = line.partition(" ")
        if path in paths and path in after and before.get(path) not in (None, after[path]):
            url = repo.config("--blob", f"{sha}:.gitmodules", "--get", key.removesuffix(".path") + ".url")
            found.append(Bump(path, before[path], after[path], url.strip(),
                              pure=not (changed - {path, ".gitmodules"})))
    return found


def rewritten(url: str, rewrites: dict[str, str]) -> str:
    """``url`` through ``submodule_rewrites`` as git's ``insteadOf`` reads them (the longest
    matching prefix wins)."""
    prefix = max((p for p in rewrites if url.startswith(p)), key=len, default=None)
    return url if prefix is None else rewrites[prefix] + url[len(prefix):]


def _into_submodule(session: Session, config: Config, mirror: RepoMirror, tester: _Tester,
                    names: frozenset[str], sha: str, progress: driver.Progress) -> None:
    """Bisect on into the submodule bump of culprit ``sha`` for ``names`` (see the module);
    the submodule commit found is stored on their regressions."""
    paths = list(getattr(config.build, "submodules", None) or [])
    for bump in bumps(mirror, sha, paths):
        try:
            sub_mirror = RepoMirror(rewritten(bump.url, getattr(config.build, "submodule_rewrites", {})),
                                    config.cache_dir)
            sub_mirror.fetch_for(bump.new)
            moved = sub_mirror.first_parents(bump.old, bump.new)
        except (RepoError, git.GitCommandError) as exc:
            progress.message(f"  {bump.path} of {sha[:12]}: not bisected ({exc})")
            continue
        if not bisect_search.into_bump(bump.new, moved):  # moved back, or to a side line: no range to search
            progress.message(f"  {bump.path} of {sha[:12]}: {bump.new[:12]} is not after {bump.old[:12]} "
                             "on its first-parent line; not bisected")
            continue
        parent = mirror.repo.git.rev_parse(f"{sha}^")
        span = bisect_search.bump_range(bump.path, bump.old, moved, bump.pure)
        n = len(span.commits)
        progress.message(f"bisecting into {bump.path} of {sha[:12]}: {len(moved)} commit(s) {bump.old[:12]}.."
                         f"{bump.new[:12]}, TVM at {sha[:12]} "
                         f"({'a pure bump' if bump.pure else 'the bump changes TVM files too: the old pin first'}); "
                         f"at most {bisect_search.max_builds(n)} builds, one more per commit that does not build "
                         "and one more once one does not")
        sub_repository = get_repository(session, bump.url)
        search, builds = bisect_search.start(names, n), 0
        limit = config.watch.max_builds_per_range
        while (step := bisect_search.next_step(search, builds, limit)).probe is not None:
            at = span.commits[step.probe.index]
            commit, _ = commit_row(session, sub_repository, sub_mirror, at)
            found, built = tester.test(step.probe.part.names, sha,
                                       _Moved(SubmodulePin(bump.path, at), commit, parent, bump.pure))
            builds += built
            search = bisect_search.judged(step.search, step.probe,
                                          {name: found[name][0] for name in step.probe.part.names})
        progress.message(f"  {bump.path}: {builds} build(s)")
        for name, index in step.search.culprits.items():
            regression, culprit = tester.by_name[name], span.culprit(index)
            if culprit is None:
                lifecycle.note(session, regression, None, f"bisection into {bump.path}: {bump.old[:12]} at "
                               f"{sha[:12]} shows it already; the bump's own changes to TVM's files are the culprit")
                continue
            regression.culprit_submodule_path = bump.path
            regression.culprit_submodule_commit, _ = commit_row(session, sub_repository, sub_mirror, culprit)
            progress.message(f"  {name}: culprit {bump.path} {culprit[:12]}")
        for name in sorted(step.search.unresolved):
            lifecycle.note(session, tester.by_name[name], None,
                           f"bisection into {bump.path}: no submodule commit named within {limit} builds")
        session.commit()
