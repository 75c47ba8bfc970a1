"""The weekly triage report: what changed among the regressions in a window, and what waits for
a person, one section per device, ranked by size (``abwatch report``, ``GET /api/report``).

Four lists per device:

- **new**: opened in the window (suspected, being verified or confirmed; not those cleared);
- **confirmed**: moved to ``regress`` in the window (verified, the culprit where bisection named it);
- **fixed**: moved to ``fixed`` in the window (a later commit measured back), or triaged
  ``fixed`` in the window (a person named the fixing commit: ``fixed_by``);
- **untriaged**: every confirmed regression no person has triaged yet, whenever it was opened.

Each list is ranked by the size of the change, largest first. :func:`to_markdown` is what a
person pastes into a forum post or an issue.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, UTC
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from abwatch.service.stats.verdict import Direction, Metric, RegressionKind, RegressionState, TriageStatus
from abwatch.service.store.base import aware
from abwatch.service.store.models import Regression, RegressionEvent, TriageEvent

SECTIONS = ("new", "confirmed", "fixed", "untriaged")
_SPAN = re.compile(r"^(\d{1,4})([hdw])$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


class ReportError(ValueError):
    """A window that cannot be read (the message says how to write one)."""


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``7d``, ``36h``, ``2w`` before ``now``, or an ISO 8601 date or time (UTC unless it says)."""
    now = now or datetime.now(UTC)
    if match := _SPAN.match(text.strip()):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReportError(f"--since {text!r}: expected a span such as 7d, 36h or 2w, or an ISO date") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)



def _entry(r: Regression, dashboard_url: str | None) -> dict[str, Any]:
    culprit = r.culprit_commit
    return {
        "id": r.id, "workload": r.workload.name, "kind": RegressionKind(r.kind).value,
        "metric": Metric(r.metric or Metric.TIME).value, "state": r.state.value, "change_pct": r.change_pct,
        "triage": r.triage.value if r.triage else None, "fixed_by": r.fixed_by,
        "culprit": {"sha": culprit.sha, "summary": culprit.summary, "author": culprit.author,
                    "submodule": r.culprit_submodule} if culprit else None,
        "range": {"good": r.control_commit.sha, "bad": r.treatment_commit.sha},
        "run_id": r.run_id, "opened_at": aware(r.created_at).isoformat(),
        "url": f"{dashboard_url.rstrip('/')}/regressions/{r.id}" if dashboard_url else None,
    }


def _moved_to(session: Session, state: RegressionState, since: datetime) -> set[int]:
    """Regressions that entered ``state`` at or after ``since`` (a note, from = to, is no move)."""
    return set(session.scalars(select(RegressionEvent.regression_id).where(
        RegressionEvent.to_state == state, RegressionEvent.at >= since,
        or_(RegressionEvent.from_state.is_(None), RegressionEvent.from_state != state))))


def build(session: Session, since: datetime, until: datetime | None = None,
          dashboard_url: str | None = None) -> dict[str, Any]:
    """The report of the window ``[since, until]`` (until: now)."""
    until = until or datetime.now(UTC)
    confirmed, fixed = _moved_to(session, RegressionState.REGRESS, since), _moved_to(session, RegressionState.FIXED, since)
    triaged_fixed = set(session.scalars(select(TriageEvent.regression_id).where(
        TriageEvent.status == TriageStatus.FIXED, TriageEvent.at >= since)))
    devices: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in session.scalars(select(Regression).where(Regression.direction == Direction.SLOWER).order_by(Regression.id)):
        lists = []
        if aware(r.created_at) >= since and r.state != RegressionState.CLEARED:
            lists.append("new")
        if r.id in confirmed:
            lists.append("confirmed")
        if (r.id in fixed and r.state == RegressionState.FIXED) or (
                r.id in triaged_fixed and r.triage == TriageStatus.FIXED):
            lists.append("fixed")
        if r.state == RegressionState.REGRESS and r.triage is None:
            lists.append("untriaged")
        if lists:
            section = devices.setdefault(r.device.name if r.device else "?", {name: [] for name in SECTIONS})
            for name in lists:
                section[name].append(_entry(r, dashboard_url))
    for section in devices.values():
        for entries in section.values():
            entries.sort(key=lambda e: (-abs(e["change_pct"]), e["id"]))
    return {"since": since.isoformat(), "until": until.isoformat(),
            "counts": {name: sum(len(s[name]) for s in devices.values()) for name in SECTIONS},
            "devices": [{"device": name, **devices[name]} for name in sorted(devices)]}


def _who(entry: dict[str, Any]) -> str:
    c = entry["culprit"]
    if c is None:
        return f"{entry['range']['good'][:12]}..{entry['range']['bad'][:12]} (not bisected)"
    author = c["author"].split(" <")[0]
    sub = c.get("submodule")  # bisected on into the culprit's submodule bump
    into = f" -> {sub['path']} {sub['sha'][:12]} \"{sub['summary']}\"" if sub else ""
    return f"{c['sha'][:12]} \"{c['summary']}\" ({author}){into}"


def _triage(entry: dict[str, Any]) -> str:
    """The decision as a person reads it: ``fixed by <sha>`` names the fixing commit."""
    if entry["fixed_by"]:
        return f"{entry['triage']} by {entry['fixed_by'][:12]}"
    return entry["triage"] or ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


TITLES = {"new": "New", "confirmed": "Confirmed", "fixed": "Fixed", "untriaged": "Untriaged (confirmed, no decision yet)"}


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: a heading per device, a table per list."""
    since, until = report["since"][:10], report["until"][:10]
    counts = report["counts"]
    lines = [f"## Performance regressions, {since} to {until}", "",
             ", ".join(f"{counts[name]} {name}" for name in SECTIONS) + ".", ""]
    if not report["devices"]:
        return "\n".join(lines + ["Nothing to report.", ""])
    for device in report["devices"]:
        lines += [f"### {device['device']}", ""]
        for name in SECTIONS:
            entries = device[name]
            if not entries:
                continue
            lines += [f"**{TITLES[name]}**", "", "| # | workload | change | kind | culprit | state | triage |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for e in entries:
                ref = f"[{e['id']}]({e['url']})" if e["url"] else str(e["id"])
                lines.append(f"| {ref} | {_cell(e['workload'])} | {e['change_pct']:+.2f}% | {e['kind']} ({e['metric']}) "
                             f"| {_cell(_who(e))} | {e['state']} | {_triage(e) or '–'} |")
            lines.append("")
    return "\n".join(lines)


def to_text(report: dict[str, Any]) -> str:
    """The report for a terminal: one line per regression under its device and list."""
    counts = report["counts"]
    lines = [f"regressions {report['since'][:19]} .. {report['until'][:19]}: "
             + ", ".join(f"{counts[name]} {name}" for name in SECTIONS)]
    for device in report["devices"]:
        lines.append(f"{device['device']}:")
        for name in SECTIONS:
            for e in device[name]:
                lines.append(f"  {name:<10} #{e['id']:<5} {e['workload']:<24} {e['change_pct']:+8.2f}%  "
                             f"{e['kind']:<12} {_who(e)}  [{e['state']}{', ' + _triage(e) if e['triage'] else ''}]")
    return "\n".join(lines)
