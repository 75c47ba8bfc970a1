"""Verify: re-run a benchmark run's pair with more repetitions and confirm or clear its suspected
regressions, each judged again by the verdict of its kind on the metric that opened it (read
through the metric registry, :func:`service.compare.metrics.judged`).

The regressions move ``benchmark`` -> ``verify`` when the verify run starts (locked, so two
verifies started at once cannot both take them), then to ``regress`` or ``cleared``; a verify
that cannot finish returns them to ``benchmark``. Confirmed ones are alerted through the outbox.
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.core.device_identity import changes

from abwatch.service import stats
from abwatch.service.compare import lifecycle, metrics
from abwatch.service.compare.driver import run_compare
from abwatch.service.compare.outcome import (
    AlreadyVerifying, CompareOutcome, DriverError, NothingToVerify, verdict_json,
)
from abwatch.service.compare.progress import NullProgress, Progress
from abwatch.service.config import Config
from abwatch.service.notify import alerts
from abwatch.service.stats.verdict import Direction, RegressionState
from abwatch.service.store.models import Regression, Run, RunType


def run_verify(session: Session, run_id: int, *, progress: Progress | None = None) -> tuple[CompareOutcome, list]:
    """Re-run the pair of ``run_id`` with more repetitions; confirm or clear its regressions."""
    progress = progress or NullProgress()
    original = session.get(Run, run_id)
    if original is None:
        raise DriverError(f"run {run_id} does not exist")
    pending = lifecycle.pending_for_run(session, run_id)
    if not pending:
        found = session.scalars(select(Regression.state).where(Regression.run_id == run_id)).all()
        states = ", ".join(f"{n} {state.value}" for state, n in sorted(Counter(found).items(), key=lambda i: i[0].value))
        raise NothingToVerify(f"nothing to verify: run {run_id} " + (
            f"has no regression still waiting for it (its regressions: {states}; `abwatch regressions`)" if found
            else "found no regression"))
    config = verify_config(Config.model_validate(original.config), {r.workload.name for r in pending})

    claimed: list = []

    def started(verify_run: Run) -> None:
        # The event names the verify run: if its process dies, the next command that opens
        # the database sees the run is not running and returns these to `benchmark`.
        # Each regression is locked and must still be suspected: of two verifies started at
        # once, the second finds them in `verify` and stops before building anything.
        for regression in sorted(pending, key=lambda r: r.id):
            try:
                lifecycle.transition(session, regression, RegressionState.VERIFY, verify_run,
                                     f"verification of run {run_id} started (verify run {verify_run.id})",
                                     expect=RegressionState.BENCHMARK)
            except lifecycle.TransitionError as exc:
                session.rollback()
                raise AlreadyVerifying(f"nothing to verify: {exc}; another verify took it first") from None
        session.commit()
        claimed.extend(pending)

    # The exact commits of the original run, even if its refs have moved since.
    try:
        outcome = run_compare(session, config, original.control_commit.sha, original.treatment_commit.sha,
                              run_type=RunType.VERIFY, parent_run_id=run_id, progress=progress,
                              on_started=started)
    except BaseException:
        _release(session, claimed)
        raise
    _settle(session, pending, outcome, run_id)
    # a confirmed improvement is told when its cause is named (service.watch.bisect), not as a regression
    confirmed = [r.id for r in pending if r.state == RegressionState.REGRESS and r.direction is Direction.SLOWER]
    # recorded with the transitions (the outbox); the caller sends them after its work
    if alerts.enqueue(session, confirmed, "regress", config.alerts):
        progress.message(f"{len(confirmed)} regression(s) to alert {len(config.alerts.webhooks)} webhook(s) of")
    session.commit()
    return outcome, pending


def verify_config(config: Config, names: set[str]) -> Config:
    """The benchmark run's config for its verification: only ``names``' workloads, with
    ``verify_factor`` times the repetitions (at least one more) and a fresh seed."""
    repetitions = max(config.run.repetitions + 1, round(config.run.repetitions * config.run.verify_factor))
    return config.model_copy(update={
        "workloads": [w for w in config.workloads if w.name in names],
        "run": config.run.model_copy(update={
            "repetitions": repetitions,
            # the cap grows with them: the stored config must validate again (bisection reads it)
            "max_repetitions": None if config.run.max_repetitions is None
            else max(config.run.max_repetitions, repetitions),
            "seed": None,
        }),
    })


def _release(session: Session, claimed: list[Regression]) -> None:
    """A verification that could not finish: what it took goes back to ``benchmark``."""
    session.rollback()
    for regression in claimed:  # only what this verify took: another verify's stay its own
        try:
            lifecycle.transition(session, regression, RegressionState.BENCHMARK, None,
                                 "verification could not finish; back to suspected",
                                 expect=RegressionState.VERIFY)
        except lifecycle.TransitionError:
            continue
    session.commit()


def _settle(session: Session, pending: list[Regression], outcome: CompareOutcome, run_id: int) -> None:
    """Each pending regression judged again by the verify run: ``regress`` where it
    reproduced, ``cleared`` where not, back to ``benchmark`` where it could not be judged."""
    verify_run = session.get(Run, outcome.run_id)
    by_name = {r.workload: r for r in outcome.results}
    for regression in pending:
        result = by_name.get(regression.workload.name)
        first = f"benchmark run {run_id}: {regression.change_pct:+.2f}%"
        if result is None or result.failure:
            why = "verify run's build failed" if result is None else result.failure
            lifecycle.transition(session, regression, RegressionState.BENCHMARK, verify_run,
                                 f"{first}; verify run {outcome.run_id} could not judge it ({why})",
                                 expect=RegressionState.VERIFY)
            continue
        # judged again by the verdict of its kind, on the metric that opened it
        v, _ = metrics.judged(result, regression.kind, regression.metric)
        regression.verify_verdict = verdict_json(v, outcome.run_id)
        second = f"verify run {outcome.run_id}: {v.verdict.value} {v.change_pct:+.2f}%" if v.change_pct is not None \
            else f"verify run {outcome.run_id}: {v.verdict.value}"
        # a suspected improvement (direction faster) is confirmed by an improvement, as a regression by a regression
        expected = stats.Outcome.IMPROVEMENT if regression.direction is Direction.FASTER else stats.Outcome.REGRESSION
        state = RegressionState.REGRESS if v.verdict == expected else RegressionState.CLEARED
        word = "reproduced" if state is RegressionState.REGRESS else "not reproduced"
        lifecycle.transition(session, regression, state, verify_run,
                             f"{word}; {first}; {second}{_moved(regression, verify_run)}",
                             expect=RegressionState.VERIFY)


def _moved(regression: Regression, verify_run: Run | None) -> str:
    """What the verdict's reason adds when the verify run measured another fingerprint of the
    device than the run that found the regression (a driver, kernel or hardware change in
    between): the A/B holds on the hardware it ran on, and the reader is told it moved."""
    found, now = regression.device, verify_run.device if verify_run is not None else None
    if found is None or now is None or found.id == now.id:
        return ""
    what = "; ".join(changes(found.fingerprint or {}, now.fingerprint or {})) or "another fingerprint"
    return (f" (measured on a changed device: {what}; fingerprint {found.fingerprint_hash[:12] or 'none'} -> "
            f"{now.fingerprint_hash[:12] or 'none'}; found on the earlier one)")
