"""Triage: a person's decision about a regression (as in Perfherder's alert triage).

A decision is ``acknowledged`` (real, being worked on), ``expected`` (a known trade-off),
``invalid`` (not a real change: noise, broken benchmark) or ``wontfix``. Each is a
:class:`~service.store.models.TriageEvent` (who, when, why, an issue link) beside the state
history; the regression's ``triage`` column holds the latest. ``expected`` and ``invalid``
regressions stop alerting and are listed apart.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from abwatch.service.store.models import Regression, TriageEvent, utcnow
from abwatch.service.stats.verdict import TriageStatus


class TriageError(Exception):
    """A triage request that names no existing regression."""


def group_of(session: Session, regression: Regression) -> list[Regression]:
    """The regressions decided together with ``regression``: itself, and the other members
    of its regression group where the watch grouped them."""
    return [regression]


def triage(session: Session, regression_id: int, status: TriageStatus | str, *, who: str,
           issue_url: str | None = None, note: str = "") -> list[Regression]:
    """Record the decision on ``regression_id`` and its group; return the regressions changed."""
    regression = session.get(Regression, regression_id)
    if regression is None:
        raise TriageError(f"regression {regression_id} does not exist")
    status = TriageStatus(status)
    now = utcnow()
    members = group_of(session, regression)
    for member in members:
        member.triage = status
        member.updated_at = now
        why = note if member.id == regression.id else f"{note} (triaged with regression {regression.id})".strip()
        session.add(TriageEvent(regression_id=member.id, status=status, who=who, issue_url=issue_url,
                                note=why, at=now))
    session.flush()
    return members
