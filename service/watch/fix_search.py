"""The search for the commit that fixed a regression (the ``fixed`` check's fixing commit).

A regression found fixed at a commit (:meth:`service.watch.controls.ControlRule.fixes`) is back
at its good commit's level there; the commit that brought it back lies between the newest commit
known to show it (:func:`fix_from`) and that one. :func:`find_fix` bisects that range with the
engine of :mod:`service.watch.bisect_search`, each step compared with the good commit and
judged by the regression's own verdict (:data:`service.watch.bisect.JUDGES`), and stores the
commit found as ``regressions.fixed_by_commit``.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from abwatch.builders.repo import RepoMirror
from abwatch.service import stats
from abwatch.service.compare import driver
from abwatch.service.config import Config
from abwatch.service.notify import alerts
from abwatch.service.stats.verdict import RegressionState
from abwatch.service.store.models import Regression, RunType
from abwatch.service.store.rows import get_repository
from abwatch.service.watch import bisect_search
from abwatch.service.watch.bisect import BAD, GOOD, JUDGES, SKIP, commit_row


def fix_from(session: Session, mirror: RepoMirror, regression: Regression, fixing: str, control: str) -> str | None:
    """Where the search for the commit that fixed ``regression`` starts: the newest commit known to
    be at its level before ``fixing`` — its bad commit, a later commit that saw it again (a pinned
    base's notes), or the control of the run that found the fix (a moving control: the commit just
    tested before, which that run found slower). None when its bad commit is not before ``fixing``."""
    bad = regression.treatment_commit.sha
    if bad == fixing or not mirror.is_ancestor(bad, fixing):
        return None
    seen = [bad, control] + [session.get_one(driver.Run, e.run_id).treatment_commit.sha for e in regression.events
                             if e.from_state == e.to_state == RegressionState.REGRESS and e.run_id is not None]
    newest = bad
    for sha in seen:
        if sha not in (newest, fixing) and mirror.is_ancestor(newest, sha) and mirror.is_ancestor(sha, fixing):
            newest = sha
    return newest


def find_fix(session: Session, config: Config, mirror: RepoMirror, regression: Regression, fixing: str,
             parent_run_id: int, progress: driver.Progress | None = None, *, start: str) -> str | None:
    """Name the commit that fixed ``regression``, found fixed at ``fixing``: the first of the
    first-parent commits (``start``, ``fixing``] back at its good commit's level (the same or
    faster against it, by the verdict it is judged by). Each commit tried is compared with the good
    commit (a ``regress`` run); one that cannot be judged (no build, hung, undecided) is skipped.
    A one-commit range is ``fixing`` itself, with no build. Stored as ``fixed_by_commit``; the sha,
    or None when not named within ``[watch] max_builds_per_range`` builds."""
    progress = progress or driver.NullProgress()
    commits = mirror.first_parents(start, fixing)
    if not commits or commits[-1] != fixing:
        commits = [fixing]
    name, good, judge = regression.workload.name, regression.control_commit.sha, JUDGES[(regression.kind,
                                                                                          regression.metric)]
    run_config = config.model_copy(update={"workloads": [w for w in config.workloads if w.name == name]})
    if len(commits) > 1:
        progress.message(f"regression {regression.id} fixed at {fixing[:12]}: searching {len(commits)} commit(s) "
                         f"{start[:12]}..{fixing[:12]} for the first one back at {good[:12]}'s level")
    search, builds, limit = bisect_search.start([name], len(commits)), 0, config.watch.max_builds_per_range
    while (step := bisect_search.next_step(search, builds, limit)).probe is not None:
        sha = commits[step.probe.index]
        check = driver.run_compare(session, run_config, good, sha, run_type=RunType.REGRESS,
                                   parent_run_id=parent_run_id, progress=progress)
        builds += sum(1 for b in check.builds if not b.cached)
        result = next((r for r in check.results if r.workload == name), None)
        v, failure = judge(result) if result is not None else (None, "not measured")
        if failure or v is None or v.verdict == stats.Outcome.UNKNOWN:
            side = SKIP
        else:  # back (the same or faster than the good commit): at or after the fix
            side = BAD if v.verdict in (stats.Outcome.SAME, stats.Outcome.IMPROVEMENT) else GOOD
        progress.message(f"  {sha[:12]}: {'back' if side == BAD else 'still slower' if side == GOOD else 'skip'} "
                         f"(run {check.run_id})")
        search = bisect_search.judged(step.search, step.probe, {name: side})
    index = step.search.culprits.get(name)
    if index is None:
        progress.message(f"regression {regression.id}: the fixing commit not named within {limit} builds")
        return None
    commit, _ = commit_row(session, get_repository(session, config.repository.url), mirror, commits[index])
    regression.fixed_by_commit = commit
    alerts.refresh_pending(session, [regression.id], "fixed", config.alerts)  # the `fixed` alert, if unsent, names it
    session.commit()
    progress.message(f"regression {regression.id}: fixed by {commit.sha[:12]} {commit.summary}")
    return commit.sha
