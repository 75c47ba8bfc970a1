"""The watch's control rules (``[watch] control``): which commit a new commit is compared with,
and what follows from that choice.

Each rule is a :class:`ControlRule` registered by name in :data:`CONTROL_RULES`; the config
names one as ``name`` or ``name:argument`` (``fixed:v0.18.0``), as its entry in
:data:`abwatch.service.config.CONTROL_FORMS` says (a new rule: a line there, its class here). A plain rule only picks the
control. A pinned base (:class:`PinnedBase`) compares every commit with one commit, so it also
changes three things the watch does with a verdict: a slowdown an open regression of an earlier
commit already explains is that regression seen again (:meth:`ControlRule.attach`), a regression
is fixed when a commit is back at the base's level (:meth:`ControlRule.fixes`), and a slowdown
beyond a confirmed one is bisected from where the first one was seen (:meth:`ControlRule.bisect_from`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from datetime import datetime, timedelta, UTC
from typing import ClassVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.core.commit_info import CommitInfo
from abwatch.core.plugins import Registry
from abwatch.builders.repo import RepoError, RepoMirror
from abwatch.service.compare import driver, lifecycle
from abwatch.service.watch import bisect
from abwatch.service.config import CONTROL_FORMS, Config
from abwatch.service.store.models import Comparison, Regression, Run, RunType
from abwatch.service.compare.driver import Attach
from abwatch.service.compare.outcome import WorkloadResult
from abwatch.service.stats.verdict import Direction, Metric, RegressionKind, RegressionState



def week_start(moment: datetime | None) -> datetime | None:
    """Monday 00:00 UTC of ``moment``'s week (a naive ``moment``, as SQLite returns it, is UTC);
    None for a commit without a time."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


class ControlRule(abc.ABC):
    """A way to pick a commit's control. ``pick`` is the rule; the other methods say what a
    verdict against that control means, and default to what a moving control means."""

    name: ClassVar[str]

    def __init__(self, config: Config, argument: str = "") -> None:
        self.config, self.argument = config, argument

    def check(self, mirror: RepoMirror) -> None:
        """Fail a pass at once, naming the config, if the rule cannot work (nothing by default)."""
        return

    @abc.abstractmethod
    def pick(self, mirror: RepoMirror, info: CommitInfo, tested: Iterable[str]) -> str | None:
        """The control of ``info``; None: ``info`` is a baseline. ``tested`` is this watch's
        commits that built and ran, newest first."""

    def attach(self, mirror: RepoMirror) -> Attach | None:
        """How a run's slowdown finds an open regression it is the same as (None: never)."""
        return None

    def fixes(self, session: Session, run: Run, result: WorkloadResult, kind: RegressionKind,
              metric: Metric = Metric.TIME) -> list[int]:
        """Mark ``regress`` regressions of ``kind`` fixed that this run may undo, by measuring it.

        An improvement (by the verdict ``kind`` is judged by) on a workload with a ``regress``
        regression is only a hint: the commit is compared again with the regression's good commit,
        with the same statistics. ``same`` or faster there is ``fixed``, the check's run its
        evidence; anything else is a note on the regression saying why not. (Multiplying the two
        estimates instead made the outcome hang on the noise of the first one.) The ids fixed.
        """
        v, not_judged = bisect.JUDGES[(kind, metric)](result)
        if not_judged or v.verdict.value != "improvement" or v.change_pct is None:
            return []
        fixed = []
        for regression in _regressed(session, run, result, kind, metric):
            good = regression.control_commit.sha
            check = driver.run_compare(
                session, self.config.model_copy(update={
                    "workloads": [w for w in self.config.workloads if w.name == result.workload]}),
                good, run.treatment_commit.sha, run_type=RunType.REGRESS, parent_run_id=run.id)
            checked = next((r for r in check.results if r.workload == result.workload), None)
            w, failed = bisect.JUDGES[(kind, metric)](checked) if checked is not None else (None, "not measured")
            where = f"run {check.run_id}: {run.treatment_commit.sha[:12]} against the good commit {good[:12]}"
            if failed or w is None:
                lifecycle.note(session, regression, run, f"not marked fixed: {where} could not judge ({failed})")
            elif w.verdict.value in ("same", "improvement"):
                lifecycle.transition(session, regression, RegressionState.FIXED, session.get_one(Run, check.run_id),
                                     f"{where}: {w.verdict.value} ({w.change_pct:+.2f}%); "
                                     f"it was {regression.change_pct:+.2f}%")
                fixed.append(regression.id)
            else:
                lifecycle.note(session, regression, run, f"not marked fixed: {where}: {w.verdict.value} "
                               f"({w.change_pct:+.2f}%), not the same or faster" if w.change_pct is not None
                               else f"not marked fixed: {where}: {w.verdict.value}")
        return fixed

    def bisect_from(self, session: Session, mirror: RepoMirror, regression: Regression) -> str | None:
        """Where the bisection of ``regression`` starts; None: its control."""
        return None


class Previous(ControlRule):
    """The last commit of the branch this watch tested that built and ran."""

    name = "previous"

    def pick(self, mirror: RepoMirror, info: CommitInfo, tested: Iterable[str]) -> str | None:
        # only ancestors: after a force-push the commits of the old line are never picked
        return next((sha for sha in tested if sha != info.sha and mirror.is_ancestor(sha, info.sha)), None)


class Parent(ControlRule):
    """The commit's first parent."""

    name = "parent"

    def pick(self, mirror: RepoMirror, info: CommitInfo, tested: Iterable[str]) -> str | None:
        parents = mirror.repo.commit(info.sha).parents
        return parents[0].hexsha if parents else None


class WeekStart(ControlRule):
    """The first tested commit of the commit's UTC week (Monday 00:00 UTC on); a week's first
    commit is compared with the previous one, which then opens the week."""

    name = "week-start"

    def pick(self, mirror: RepoMirror, info: CommitInfo, tested: Iterable[str]) -> str | None:
        # commit times from the commit objects (RepoMirror.committed_at: before 1970 and any offset too)
        monday = week_start(mirror.committed_at(info.sha))
        newest, earliest_this_week = None, None
        for sha in tested:  # newest first
            in_week = week_start(mirror.committed_at(sha)) == monday
            if sha == info.sha or (newest is not None and not in_week):
                continue  # (asks git only about commits that could still be picked)
            if not mirror.is_ancestor(sha, info.sha):
                continue
            newest = newest or sha
            if in_week:
                earliest_this_week = sha
        return earliest_this_week or newest


class PinnedBase(ControlRule):
    """``fixed:<ref>``: every commit against one base (a release, say)."""

    name = "fixed"

    def check(self, mirror: RepoMirror) -> None:
        try:
            mirror.resolve(self.argument)
        except RepoError:
            raise RepoError(f"{self.config.at('watch.control')}: {self.argument!r} (of "
                            f"{self.config.watch.control!r}) names no commit in {mirror.display_url}") from None

    def pick(self, mirror: RepoMirror, info: CommitInfo, tested: Iterable[str]) -> str | None:
        control = mirror.resolve(self.argument).sha
        return None if control == info.sha else control  # the pinned base itself: its baseline

    def attach(self, mirror: RepoMirror) -> Attach | None:
        """A regression at C shows again at C+1, C+2, ...: those are the open (confirmed)
        regression of C seen again, not new ones. Found by: same workload, device, kind and
        base, its bad commit an ancestor of this one, and this run's evidence not beyond its
        change by more than the threshold (the lower end of this run's confidence interval: a
        slowdown significantly further than the open one's is a new regression)."""
        threshold = self.config.stats.threshold_pct

        def attach(session: Session, run: Run, comparison: Comparison, kind: RegressionKind,
                   least_pct: float) -> Regression | None:
            for regression in session.scalars(
                    select(Regression).where(
                        Regression.workload_id == comparison.workload_id, Regression.device_id == run.device_id,
                        Regression.kind == kind, Regression.control_commit_id == run.control_commit_id,
                        Regression.direction == Direction.SLOWER,
                        Regression.treatment_commit_id != run.treatment_commit_id,
                        Regression.state == RegressionState.REGRESS).order_by(Regression.id)):
                further = (1 + least_pct / 100) / (1 + regression.change_pct / 100)
                if further <= 1 + threshold / 100 and mirror.is_ancestor(regression.treatment_commit.sha,
                                                                          run.treatment_commit.sha):
                    return regression
            return None

        return attach

    def fixes(self, session: Session, run: Run, result: WorkloadResult, kind: RegressionKind,
              metric: Metric = Metric.TIME) -> list[int]:
        """The run measures the level itself: fixed when its change against the base is back
        within the threshold and its confidence interval lies wholly below the regression's
        change (so it is not the regression measured low by chance)."""
        v, not_judged = bisect.JUDGES[(kind, metric)](result)
        if (not_judged or v.verdict.value == "regression" or v.change_pct is None or v.ci_pct is None
                or v.change_pct > self.config.stats.threshold_pct):
            return []
        fixed = []
        for regression in _regressed(session, run, result, kind, metric):
            if regression.control_commit_id == run.control_commit_id and v.ci_pct[1] < regression.change_pct:
                lifecycle.transition(session, regression, RegressionState.FIXED, run,
                                     f"run {run.id}: back to the base ({v.change_pct:+.2f}%, CI "
                                     f"{v.ci_pct[0]:+.2f}..{v.ci_pct[1]:+.2f}%; it was {regression.change_pct:+.2f}%)")
                fixed.append(regression.id)
        return fixed

    def bisect_from(self, session: Session, mirror: RepoMirror, regression: Regression) -> str | None:
        """A regression opened although an earlier one against the same base is confirmed is a
        further slowdown: every commit since the earlier culprit is slower than the base, so
        bisecting from the base would name that culprit again. Its good end is the newest commit
        known to be at the earlier regression's level (its bad commit, or a later commit that saw
        it again)."""
        bad = regression.treatment_commit.sha
        newest: str | None = None
        if regression.direction is Direction.FASTER:  # an improvement: from the base
            return None
        for earlier in session.scalars(select(Regression).where(
                Regression.id != regression.id, Regression.workload_id == regression.workload_id,
                Regression.device_id == regression.device_id, Regression.kind == regression.kind,
                Regression.control_commit_id == regression.control_commit_id,
                Regression.direction == Direction.SLOWER, Regression.state == RegressionState.REGRESS)):
            seen = [earlier.treatment_commit.sha] + [
                session.get_one(Run, e.run_id).treatment_commit.sha for e in earlier.events
                if e.from_state == e.to_state == RegressionState.REGRESS and e.run_id is not None]
            for sha in seen:
                if sha != bad and mirror.is_ancestor(sha, bad) and (newest is None or mirror.is_ancestor(newest, sha)):
                    newest = sha
        return newest


# The rules a config may name (config.WatchConfig.control), by the names of config's
# CONTROL_FORMS (which says how each is written; a name it lacks is refused).
CONTROL_RULES: Registry[type[ControlRule]] = Registry(
    "control rule", ((rule.name, rule) for rule in (Previous, Parent, WeekStart, PinnedBase)), of=CONTROL_FORMS)


def control_rule(config: Config) -> ControlRule:
    """The rule ``[watch] control`` names (``name`` or ``name:argument``)."""
    name, _, argument = config.watch.control.partition(":")
    return CONTROL_RULES[name](config, argument)


def _regressed(session: Session, run: Run, result: WorkloadResult, kind: RegressionKind,
               metric: Metric) -> list[Regression]:
    """``regress`` regressions of ``kind`` opened on ``metric``, on the run's device and this
    result's workload series (another repository's or another spec's workload of this name is
    not undone)."""
    workload_id = session.get_one(Comparison, result.comparison_id).workload_id
    return list(session.scalars(select(Regression).where(
        Regression.state == RegressionState.REGRESS, Regression.kind == kind, Regression.metric == metric,
        Regression.direction == Direction.SLOWER,
        Regression.device_id == run.device_id, Regression.workload_id == workload_id)))
