"""Triage: a person's decision about a regression (as in Perfherder's alert triage).

A decision is ``acknowledged`` (real, being worked on), ``expected`` (a known trade-off),
``invalid`` (not a real change: noise, broken benchmark), ``wontfix`` or ``fixed`` (a later
commit fixed it: the event keeps that commit, ``fixed_by``). Each is a
:class:`~service.store.models.TriageEvent` (who, when, why, an issue link) beside the state
history; the regression's ``triage`` column holds the latest. ``expected``, ``invalid`` and
``fixed`` regressions stop alerting and are listed apart (``SILENCED_TRIAGE``).
"""

from __future__ import annotations

import re

from sqlalchemy.orm import Session

from abwatch.service.store.models import Regression, TriageEvent, utcnow
from abwatch.service.stats.verdict import TriageStatus


SHA = re.compile(r"^[0-9a-f]{7,40}$")  # a fixing commit as a person names it: hex, at least 7 digits


class TriageError(Exception):
    """A triage request that names no existing regression, or a fixing commit that is not one."""


def group_of(session: Session, regression: Regression) -> list[Regression]:
    """The regressions decided together with ``regression``: itself, and the other members
    of its regression group where the watch grouped them."""
    return [regression]


def triage(session: Session, regression_id: int, status: TriageStatus | str, *, who: str,
           issue_url: str | None = None, note: str = "", fixed_by: str | None = None) -> list[Regression]:
    """Record the decision on ``regression_id`` and its group; return the regressions changed.
    ``fixed_by``: the fixing commit of a ``fixed`` decision."""
    regression = session.get(Regression, regression_id)
    if regression is None:
        raise TriageError(f"regression {regression_id} does not exist")
    status = TriageStatus(status)
    if fixed_by is not None and (status is not TriageStatus.FIXED or not SHA.match(fixed_by)):
        raise TriageError(f"a fixing commit ({fixed_by[:64]!r}) goes with `fixed` and is 7 to 40 hex digits")
    now = utcnow()
    members = group_of(session, regression)
    for member in members:
        member.triage = status
        member.updated_at = now
        why = note if member.id == regression.id else f"{note} (triaged with regression {regression.id})".strip()
        session.add(TriageEvent(regression_id=member.id, status=status, who=who, issue_url=issue_url,
                                note=why, at=now, fixed_by=fixed_by))
    session.flush()
    return members
