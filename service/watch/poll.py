"""The watch: poll a branch, queue its new commits, A/B-test each against its control, escalate.

A *pass* (:func:`poll`) fetches the repository and queues one ``test`` job per new commit
and device (every ``step``-th commit, or the head once per tick in nightly mode). A job
(:func:`test_commit`) picks the control by the ``[watch] control`` rule at the time it runs,
compares through :func:`~service.compare.driver.run_compare` (the one way a comparison happens),
verifies a suspected regression with :func:`~service.compare.verify.run_verify`, bisects a confirmed
one (:mod:`service.watch.bisect`), and marks earlier regressions ``fixed`` when the commit brings
the workload back. Progress lives in ``watch_progress`` and ``watched_commits``.

Alerts of both events (``regress`` by ``run_verify``, ``fixed`` here) are recorded in the
outbox with the state change (:func:`service.notify.alerts.enqueue`) and sent by the loop that runs
the job, after it (:mod:`service.watch.daemon`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import git
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from abwatch.core.commit_info import CommitInfo, storable
from abwatch.core.config_base import spec_hash
from abwatch.service.compare import building, driver, lifecycle, outcome, verify
from abwatch.service.notify import alerts, github
from abwatch.service.watch import bisect, fix_search, queue, retry, upkeep
from abwatch.service.config import Config, RunnerConfig
from abwatch.service.watch.controls import control_rule
from abwatch.service.watch.device_config import device_names, for_device
from abwatch.service.store.models import (
    BuildStatus, Commit, CommitStatus, Comparison, Job, Regression, Repository, Run, RunStatus, WatchedCommit, WatchProgress, utcnow,
)
from abwatch.service.stats.verdict import Direction, Metric, Outcome, RegressionKind, RegressionState
from abwatch.builders import BuildFailed, make_builder
from abwatch.builders.repo import RepoError, RepoMirror
from abwatch.service.store import build_jobs
from abwatch.service.store.rows import get_commit, get_repository, insert_ignoring_conflict

OK, BUILD_FAILED, FAILED, QUEUED, BASELINE, SKIPPED = (
    CommitStatus.OK, CommitStatus.BUILD_FAILED, CommitStatus.FAILED, CommitStatus.QUEUED, CommitStatus.BASELINE,
    CommitStatus.SKIPPED)
GOOD = (OK, BASELINE)  # statuses a later commit may be compared with


def config_hash(config: Config) -> str:
    """What makes two watches of one branch different: builds, workloads, runner, statistics."""
    payload = config.model_dump(mode="json", include={"build", "workloads", "run", "stats", "runner"})
    payload["runner"].pop("device", None)
    payload["run"].pop("seed", None)
    if payload["stats"].get("contention_share") == 0.5:  # added later at its default: the same watch as before
        del payload["stats"]["contention_share"]
    for added in ("processes", "children_per_server", "servers_ahead"):  # the same: how a timed worker starts
        if payload["runner"].get(added) == RunnerConfig.model_fields[added].default:
            del payload["runner"][added]
    if payload["run"].get("schedule") == "interleaved":  # added later at its default: the same watch
        del payload["run"]["schedule"]
    for workload in payload["workloads"]:  # limits on what is printed, not what is measured
        for limit in ("max_output_mb", "max_samples"):
            workload.pop(limit, None)
        if workload.get("memory_bound") is False:  # added later at its default: the same watch
            del workload["memory_bound"]
        if workload.get("children_per_server", 0) is None:  # added later, unset: the same watch
            del workload["children_per_server"]
    return spec_hash(payload)


def mirror_of(config: Config) -> RepoMirror:
    """The local mirror of the watched repository."""
    return RepoMirror(config.repository.url, config.cache_dir)


@dataclass
class PassReport:
    """What one pass queued and said."""

    queued: list[tuple[str, str]] = field(default_factory=list)  # (device, sha)
    messages: list[str] = field(default_factory=list)


def _progress_row(session: Session, config: Config, device: str) -> WatchProgress:
    repository = get_repository(session, config.repository.url)
    key = dict(repository_id=repository.id, branch=config.repository.branch, device=device,
               config_hash=config_hash(config))
    # two watches of one branch (or a watch and its restart) may meet a new row at once
    insert_ignoring_conflict(session, WatchProgress, {**key, "updated_at": utcnow()}, list(key))
    return session.scalars(select(WatchProgress).filter_by(**key)).one()


def _new_commits(mirror: RepoMirror, config: Config, row: WatchProgress, head: str,
                 report: PassReport, nightly: bool) -> list[str]:
    """The commits this pass takes up for ``row``, oldest first."""
    if row.last_seen_sha is None:
        try:
            start = mirror.resolve(config.watch.start).sha if config.watch.start else head
        except RepoError as exc:
            raise RepoError(f"{config.at('watch.start')}: {exc}") from None
        if not mirror.is_ancestor(start, head):
            raise RepoError(f"{config.at('watch.start')}: {config.watch.start!r} is not on branch "
                            f"{config.repository.branch!r}")
        later = [] if nightly else mirror.first_parents(start, head)[config.watch.step - 1::config.watch.step]
        return [start] + later
    if row.last_seen_sha == head:
        return []
    base = row.last_seen_sha
    if not mirror.is_ancestor(base, head):
        try:
            merge_base = mirror.repo.git.merge_base(base, head)
        except git.GitCommandError:
            merge_base = None
        text = (f"branch {config.repository.branch!r} was force-pushed: the last commit seen, {base[:12]}, is no longer "
                f"on it; going on from {'the fork point ' + merge_base[:12] if merge_base else 'the new head'} "
                f"(the commits tested since then are kept, no longer used as controls)")
        print(f"abwatch watch: WARNING: {text}", file=sys.stderr)
        row.message = f"{utcnow().isoformat(timespec='seconds')} {text}"
        report.messages.append(text)
        if merge_base is None:  # nothing in common (or the old head is gone): never replay all history
            return [head]
        base = merge_base
        # seen up to the fork point, which is on the branch: the warning is said once per force-push,
        # also when nothing new is taken up (the branch reset to an older commit, or `step` skips it)
        row.last_seen_sha = merge_base
    if nightly:
        return [head]
    new = mirror.first_parents(base, head)
    return new[config.watch.step - 1::config.watch.step]


def poll(session: Session, config: Config, *, nightly: bool | None = None) -> PassReport:
    """Fetch the repository and queue a ``test`` job per new commit and device."""
    nightly = config.watch.schedule is not None if nightly is None else nightly
    report = PassReport()
    mirror = mirror_of(config)
    mirror.fetch()
    try:
        head = mirror.resolve(f"refs/heads/{config.repository.branch}")
    except RepoError:
        raise RepoError(f"{config.at('repo.branch')}: no branch {config.repository.branch!r} in {mirror.display_url}") \
            from None
    control_rule(config).check(mirror)  # a bad rule (a pinned base that is not there) fails the pass at once
    repository = get_repository(session, config.repository.url)
    for device in device_names(config):
        row = _progress_row(session, config, device)
        report.messages += retry.requeue(session, row)  # commits a full disk or a missing tool left untested
        new = _new_commits(mirror, config, row, head.sha, report, nightly)
        for sha in new:
            _take_up(session, config, mirror, repository, row, device, sha, report)
        if new:
            row.last_seen_sha = new[-1] if not nightly else head.sha
        row.updated_at = utcnow()
        session.commit()
        upkeep.clear_departed(session, mirror, row, head.sha, report.messages)  # culprits a force-push took off
        upkeep.resume_unfinished(session, config, row, report.messages)
        session.commit()
    return report


def _take_up(session: Session, config: Config, mirror: RepoMirror, repository: Repository, row: WatchProgress,
             device: str, sha: str, report: PassReport) -> None:
    """Queue the ``test`` job of one new commit.

    Text from git is made storable on the way in (:class:`CommitInfo`); a commit that still
    cannot be read or stored is recorded ``skipped`` with the reason, and the pass goes on:
    one odd commit must not stop the watch for the commits around it.
    """
    try:
        with session.begin_nested():
            commit = get_commit(session, repository, mirror.resolve(sha))
    except (RepoError, ValueError, SQLAlchemyError) as exc:
        reason = storable(f"commit {sha[:12]} skipped: {type(exc).__name__}: {exc}", 1000)
        print(f"abwatch watch: WARNING: {reason}", file=sys.stderr)
        report.messages.append(reason)
        with session.begin_nested():  # the sha alone: what the watch needs to remember it
            commit = get_commit(session, repository, CommitInfo(sha=sha, summary="", author="", committed_at=None))
            insert_ignoring_conflict(session, WatchedCommit, {
                "progress_id": row.id, "commit_id": commit.id, "status": SKIPPED, "reason": reason,
                "tested_at": utcnow()}, ["progress_id", "commit_id"])
        return
    job = queue.enqueue(session, "test", device, {"progress_id": row.id, "sha": sha}, f"test:{row.id}:{sha}")
    if job is not None and config.artifacts.store and session.get_bind().dialect.name == "postgresql":
        builder = make_builder(config)  # a fleet: the commit's one build job, which every device's job waits for
        if builder.store is not None:
            build_jobs.enqueue(session, sha, builder.cache_key(sha))
    if job is not None:
        session.add(WatchedCommit(progress_id=row.id, commit_id=commit.id, status=QUEUED))
        github.enqueue(session, config.github, sha, "pending", device, f"queued for {device}")
        report.queued.append((device, sha))


def _tested(session: Session, row: WatchProgress) -> list[tuple[WatchedCommit, Commit]]:
    """The commits of ``row`` that a later one may be compared with, newest first."""
    return list(session.execute(
        select(WatchedCommit, Commit).join(Commit, Commit.id == WatchedCommit.commit_id)
        .where(WatchedCommit.progress_id == row.id, WatchedCommit.status.in_(GOOD))
        .order_by(WatchedCommit.id.desc())).all())


def pick_control(session: Session, config: Config, mirror: RepoMirror, row: WatchProgress,
                 info: CommitInfo) -> str | None:
    """The control sha the ``[watch] control`` rule (:mod:`service.watch.controls`) picks for ``info``;
    None: the commit is a baseline. The rule chooses among this watch's commits that built and
    ran (``ok``/``baseline``), newest first."""
    return control_rule(config).pick(mirror, info, (commit.sha for _, commit in _tested(session, row)))


def _fixes(session: Session, config: Config, outcome: outcome.CompareOutcome) -> list[int]:
    """Mark ``regress`` regressions fixed that this run undoes, each kind by the verdict it is
    judged by (:data:`service.watch.bisect.JUDGES`), as the control rule says (:meth:`ControlRule.fixes`)."""
    run = session.get_one(Run, outcome.run_id)
    rule = control_rule(config)
    return [regression_id for result in outcome.results for kind, metric in bisect.JUDGES
            for regression_id in rule.fixes(session, run, result, kind, metric)]


def _open_improvements(session: Session, config: Config, outcome: outcome.CompareOutcome,
                       fixed: list[int]) -> list[int]:
    """With ``"improvement"`` in ``[watch] bisect``: a suspected improvement (a ``faster`` row,
    verified and bisected like a regression, so that its cause is named) for each workload whose
    run verdict (its first metric's) is an improvement and that opened no regression. An
    improvement that fixed a regression (``fixed``) is that fix, named as its fixing commit: not
    opened. The ids."""
    if "improvement" not in config.watch.bisect:
        return []
    run = session.get_one(Run, outcome.run_id)
    undone = {session.get_one(Regression, i).workload_id for i in fixed}
    first = {w.name: Metric(w.measure[0]) for w in config.workloads}
    opened = []
    for r in outcome.results:
        if r.failure or r.regression_id is not None or r.verdict.verdict != Outcome.IMPROVEMENT:
            continue
        comparison = session.get_one(Comparison, r.comparison_id)
        if comparison.workload_id in undone:
            continue
        if (seen := _open_faster(session, config, run, comparison)) is not None:
            lifecycle.note(session, seen, run, f"seen again by run {run.id} ({run.treatment_commit.sha[:12]} against "
                                               f"{run.control_commit.sha[:12]}): the same improvement, not opened again")
            continue
        improvement = lifecycle.open_regression(session, run, comparison,
                                                RegressionKind.RUNTIME, metric=first[r.workload],
                                                direction=Direction.FASTER)
        if improvement.run_id == run.id and improvement.direction is Direction.FASTER:
            improvement.benchmark_verdict = {**_verdict_json(r, run.id), "metric": first[r.workload].value}
            opened.append(improvement.id)
    return opened


def _open_faster(session: Session, config: Config, run: Run, comparison: Comparison) -> Regression | None:
    """Against a pinned base (``fixed:<ref>``) every commit after an improvement is faster too: the
    confirmed improvement of the same workload, device and base, an earlier commit's, is that one seen again."""
    if not config.watch.control.startswith("fixed:"):
        return None
    return session.scalars(select(Regression).where(
        Regression.workload_id == comparison.workload_id, Regression.device_id == run.device_id,
        Regression.control_commit_id == run.control_commit_id, Regression.kind == RegressionKind.RUNTIME,
        Regression.treatment_commit_id != run.treatment_commit_id, Regression.direction == Direction.FASTER,
        Regression.state == RegressionState.REGRESS).order_by(Regression.id)).first()


def _verdict_json(result: outcome.WorkloadResult, run_id: int) -> dict:
    """The stored form of ``result``'s run verdict (as ``regressions.benchmark_verdict`` keeps it)."""
    return outcome.verdict_json(result.verdict, run_id)


def test_commit(session: Session, config: Config, job: Job, progress: driver.Progress | None = None) -> dict:
    """The ``test`` job: compare one commit with its control and escalate what it finds.

    A job taken up again after its worker died carries on where the stored rows say it
    stopped: the comparison is redone only if its outcome was never committed (the run it
    left is marked abandoned); a finished comparison goes straight on to verify and bisect.
    """
    progress = progress or driver.NullProgress()
    row = session.get_one(WatchProgress, job.payload["progress_id"])
    sha = job.payload["sha"]
    config = for_device(config, job.device)
    mirror = mirror_of(config)
    info = mirror.resolve(sha)
    commit = get_commit(session, get_repository(session, config.repository.url), info)
    watched = session.scalars(select(WatchedCommit).filter_by(progress_id=row.id, commit_id=commit.id)).one()
    result: dict = {"sha": sha, "confirmed": [], "fixed": []}
    if watched.status == QUEUED:
        try:
            if not _compare_queued(session, config, mirror, row, watched, (sha, info), progress, result):
                _commit_status(session, config, job.device, sha, watched, result)
                return {**result, "status": watched.status}
        except Exception as exc:
            # an error, not a verdict (the job is marked failed with it): the commit is not
            # left `queued`, and the next one is compared with the last good commit; but a full
            # disk or a missing tool is the machine's: it stays `queued`, the next pass retries it
            session.rollback()
            untested = retry.untested(session, config, job, sha, exc)
            if untested is not None:
                raise untested from exc
            session.execute(update(WatchedCommit).where(WatchedCommit.id == watched.id).values(status=FAILED))
            session.commit()
            raise
    elif watched.run_id is not None:
        progress.message(f"{sha[:12]}: compared already in run {watched.run_id}; carrying on from there")
    result.update(control=watched.control_sha, run_id=watched.run_id, status=watched.status)
    if watched.status in (OK, FAILED) and watched.run_id is not None:
        result["confirmed"] = _escalate(session, config, mirror, watched.run_id, progress)
    if result["fixed"] and "regression" in config.watch.bisect:
        _name_fixes(session, config, mirror, session.get_one(Run, watched.run_id), result["fixed"], progress)
    _commit_status(session, config, job.device, sha, watched, result)
    return result


def _compare_queued(session: Session, config: Config, mirror: RepoMirror, row: WatchProgress,
                    watched: WatchedCommit, commit: tuple[str, CommitInfo], progress: driver.Progress,
                    result: dict) -> bool:
    """Compare a queued commit with its control and store its status (committed), with the fixes
    its run makes into ``result``; the first commit of a watch has no control: it is built as the
    baseline later ones are compared with. ``commit``: the job's sha and what it resolved to.
    Returns False for a baseline (nothing was compared)."""
    sha, info = commit
    control = pick_control(session, config, mirror, row, info)
    watched.control_sha, watched.tested_at = control, utcnow()
    if control is None:  # the first commit of a watch: built so later ones can be compared with it
        watched.status = _baseline(session, config, sha, progress)
        if watched.status == BASELINE:
            row.last_tested_sha = sha
        session.commit()
        return False
    compared = driver.run_compare(session, config, control, sha, progress=progress,
                                  attach=control_rule(config).attach(mirror))
    # the run, the commit's status and the fixes are committed together: a retry trusts them
    watched.run_id = compared.run_id
    watched.status, hung = status_of(compared)
    if watched.status != BUILD_FAILED:
        result["hung"] = hung
        if not hung:
            row.last_tested_sha = sha
        result["fixed"] = _fixes(session, config, compared)
        _open_improvements(session, config, compared, fixed=result["fixed"])
        alerts.enqueue(session, result["fixed"], "fixed", config.alerts)  # sent after the job
    session.commit()
    return True


def status_of(compared: outcome.CompareOutcome) -> tuple[CommitStatus, list[str]]:
    """A compared commit's status, and the workloads that hung or crashed: ``build_failed`` is
    recorded, never a regression (the next commit is compared with the last good one); ``failed``
    when a workload could not be judged; else ``ok``."""
    if compared.status == RunStatus.BUILD_FAILED.value:
        return BUILD_FAILED, []
    hung = [r.workload for r in compared.results if r.failure]
    return (FAILED if hung else OK), hung


def _commit_status(session: Session, config: Config, device: str, sha: str, watched: WatchedCommit,
                   result: dict) -> None:
    """The GitHub status of a tested commit (``[github]``; recorded in the outbox, sent after the job)."""
    if config.github is None or watched.status in (QUEUED, SKIPPED):
        return
    url = github.run_url(config.alerts.dashboard_url, watched.run_id)
    if result["confirmed"]:
        state, text = "failure", f"{len(result['confirmed'])} regression(s) confirmed on {device}"
    elif watched.status == BUILD_FAILED:
        state, text = "error", "the build failed"
    elif watched.status == FAILED:
        state, text = "error", f"could not be judged: {', '.join(result.get('hung', [])) or 'the job failed'}"
    else:
        state, text = "success", ("baseline built" if watched.status == BASELINE else "no regression confirmed")
    github.enqueue(session, config.github, sha, state, device, text, url)
    session.commit()


def _escalate(session: Session, config: Config, mirror: RepoMirror, run_id: int,
              progress: driver.Progress) -> list[int]:
    """Verify the run's suspected regressions, bisect the confirmed ones; the ids confirmed.

    Also bisects confirmed regressions of the run that have no culprit yet (a worker died
    while bisecting): the cached builds make the second bisection cheap.
    """
    confirmed: list[int] = []
    if config.watch.verify and lifecycle.pending_for_run(session, run_id):
        _, checked = verify.run_verify(session, run_id, progress=progress)
        # a confirmed improvement is no regression: it fails no status and sets no exit status
        confirmed = [r.id for r in checked if r.state == RegressionState.REGRESS and r.direction is Direction.SLOWER]
    if directions := bisect.directions(config):
        unbisected = list(session.scalars(
            select(Regression).where(Regression.run_id == run_id, Regression.state == RegressionState.REGRESS,
                                     Regression.direction.in_(directions),
                                     Regression.kind.in_(bisect.BISECTED_KINDS), Regression.culprit_commit_id.is_(None))
            .order_by(Regression.id)))
        by_verify: dict[tuple[int, str, str, str, str | None], list[Regression]] = {}
        for regression in unbisected:  # one bisection per verify run (its config and budget), kind, metric,
            # direction, start
            verify_run = max(e.run_id for e in regression.events  # the confirming run, not a later note
                             if e.to_state == RegressionState.REGRESS and e.from_state != e.to_state
                             and e.run_id is not None)
            start = control_rule(config).bisect_from(session, mirror, regression)
            key = (verify_run, regression.kind, regression.metric, regression.direction, start)
            by_verify.setdefault(key, []).append(regression)
        for (verify_run, _, _, _, start), regressions in by_verify.items():
            bisect.find_culprit(session, config, mirror, regressions, verify_run, progress, good=start)
    session.commit()
    return confirmed


def _name_fixes(session: Session, config: Config, mirror: RepoMirror, run: Run, fixed: list[int],
                progress: driver.Progress) -> None:
    """Name the commit that fixed each regression of ``fixed`` (:func:`fix_search.find_fix`), found
    fixed by ``run``: from the newest commit known to show it to the run's commit."""
    fixing = run.treatment_commit.sha
    for regression_id in fixed:
        regression = session.get_one(Regression, regression_id)
        start = fix_search.fix_from(session, mirror, regression, fixing, run.control_commit.sha)
        if start is not None:
            fix_search.find_fix(session, config, mirror, regression, fixing, run.id, progress, start=start)


def _baseline(session: Session, config: Config, sha: str, progress: driver.Progress) -> CommitStatus:
    """Build the watch's first commit; its status. With a shared artifact store the build takes
    the store's path (:mod:`service.compare.shared`: fetched, waited for, or built and pushed)."""
    progress.message(f"baseline {sha[:12]}: building")
    builder = make_builder(config)
    if builder.store is not None:
        built = building.build_commits(session, builder, [sha], progress)
        return BASELINE if built[0].status == BuildStatus.SUCCESS.value else BUILD_FAILED
    try:
        builder.build(sha)
    except BuildFailed as exc:
        progress.message(f"baseline {sha[:12]}: build FAILED: {exc}")
        return BUILD_FAILED
    return BASELINE
