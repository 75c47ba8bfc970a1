"""Bisection: name the commit that caused a confirmed regression.

The range is the first-parent commits after the regression's control (good) up to its
treatment (bad). Each step A/B-tests the commit nearest the middle against the good end
through :func:`~service.driver.run_compare` (run type ``regress``, so no new regressions
are opened); when that comparison cannot decide, the same commit is compared with the bad
end (both builds are cached by then, so it costs no build). A commit that does not build is
skipped (``git bisect skip``) and the next one nearest the middle is tried. Every step is a
:class:`~service.models.BisectionStep`; the culprit and the group (regressions with the same
culprit on one device) are stored on each regression.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from abwatch.service import driver, stats
from abwatch.service.config import Config
from abwatch.service.models import BisectionStep, Regression, RunType
from abwatch.builders.repo import RepoMirror
from abwatch.service.store import get_commit, get_repository

BAD, GOOD, SKIP = "bad", "good", "skip"


def max_builds(n: int) -> int:
    """The builds a range of ``n`` commits may take without broken commits: ceil(log2 n) + 1."""
    return max(1, (n - 1).bit_length()) + 1 if n > 1 else 1


def _side(outcome: driver.CompareOutcome, names: set[str], good_is_control: bool) -> tuple[str, dict]:
    """Whether the tried commit looks good or bad (or undecided), and each workload's verdict."""
    verdicts = {r.workload: r.verdict for r in outcome.results if r.workload in names}
    found = {name: (v.verdict.value, v.change_pct) for name, v in verdicts.items()}
    slower = any(v.verdict == stats.Outcome.REGRESSION for v in verdicts.values())
    undecided = any(v.verdict == stats.Outcome.UNKNOWN for v in verdicts.values())
    if good_is_control:  # tried commit is the treatment against the good end
        return (BAD if slower else (None if undecided else GOOD)), found
    # against the bad end (tried commit is the control): the bad end slower means it is good
    return (GOOD if slower else (None if undecided else BAD)), found


def find_culprit(session: Session, config: Config, mirror: RepoMirror, regressions: list[Regression],
                 parent_run_id: int, progress: driver.Progress | None = None) -> str | None:
    """Bisect the range of ``regressions`` (one run's confirmed ones); the culprit sha, or None."""
    from abwatch.service.watch import first_parents  # the watch imports this module

    progress = progress or driver.NullProgress()
    first = regressions[0]
    good, bad = first.control_commit.sha, first.treatment_commit.sha
    commits = first_parents(mirror, good, bad)
    if not commits or commits[-1] != bad:  # not on one first-parent line (e.g. a fixed: control)
        commits = [bad]
    names = {r.workload.name for r in regressions}
    stored = session.get(driver.Run, parent_run_id).config
    run_config = Config.model_validate(stored)
    run_config = run_config.model_copy(update={
        "workloads": [w for w in run_config.workloads if w.name in names],
        "run": run_config.run.model_copy(update={"seed": None})})
    repository = get_repository(session, config.repo.url)
    lo, hi, skipped, builds, position = -1, len(commits) - 1, set(), 0, 0
    limit = config.watch.max_builds_per_range
    progress.message(f"bisecting {len(commits)} commit(s) {good[:12]}..{bad[:12]} for {sorted(names)}")
    while hi - lo > 1 and builds < limit:
        candidates = [i for i in range(lo + 1, hi) if i not in skipped]
        if not candidates:
            break  # only broken commits left between: the culprit is one of them or hi
        middle = (lo + hi) / 2
        mid = min(candidates, key=lambda i: (abs(i - middle), i))
        sha = commits[mid]
        outcome = driver.run_compare(session, run_config, good, sha, run_type=RunType.REGRESS,
                                     parent_run_id=parent_run_id, progress=progress)
        builds += sum(1 for b in outcome.builds if not b.cached)
        if outcome.status == "build_failed":
            skipped.add(mid)
            verdict, found = SKIP, {}
        else:
            verdict, found = _side(outcome, names, good_is_control=True)
            if verdict is None:  # undecided against the good end: ask the bad end
                outcome = driver.run_compare(session, run_config, sha, bad, run_type=RunType.REGRESS,
                                             parent_run_id=parent_run_id, progress=progress)
                verdict, _ = _side(outcome, names, good_is_control=False)
                verdict = verdict or BAD  # neither end tells them apart: keep the earlier commit
        commit = get_commit(session, repository, mirror.resolve(sha))
        for regression in regressions:
            value, change = found.get(regression.workload.name, ("build_failed" if verdict == SKIP else "", None))
            session.add(BisectionStep(regression_id=regression.id, position=position, commit_id=commit.id,
                                      run_id=outcome.run_id, verdict=f"{value} ({verdict})" if value else verdict,
                                      change_pct=change))
        position += 1
        session.commit()
        progress.message(f"  {sha[:12]}: {verdict}")
        if verdict == BAD:
            hi = mid
        elif verdict == GOOD:
            lo = mid
    culprit = commits[hi] if hi - lo == 1 or not [i for i in range(lo + 1, hi) if i not in skipped] else None
    if culprit is not None:
        name_culprit(session, regressions, mirror, culprit)
    session.commit()
    return culprit


def name_culprit(session: Session, regressions: list[Regression], mirror: RepoMirror, sha: str) -> None:
    """Store ``sha`` as the culprit of ``regressions`` and group them with others of the same culprit."""
    repository = get_repository(session, regressions[0].control_commit.repository.url)
    commit = get_commit(session, repository, mirror.resolve(sha))
    for regression in regressions:
        regression.culprit_commit_id = commit.id
    session.flush()
    for device_id in {r.device_id for r in regressions}:
        same = (Regression.culprit_commit_id == commit.id, Regression.device_id == device_id)
        group = session.scalar(select(func.min(Regression.id)).where(*same))
        session.execute(update(Regression).where(*same).values(group_id=group))
    session.flush()
