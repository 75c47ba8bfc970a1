"""The culprit's pull request is told: when bisection names the commit that caused a confirmed
regression (or a confirmed improvement), the pull request that merged it gets a comment saying
so, with the change, the workload, the device, the verify run and, when the bisection went on
into a submodule bump, the submodule commit.

Which pull request: a squash-merged commit's summary ends with ``(#NNNN)`` (apache/tvm's
convention), else GitHub is asked when sending (``GET /repos/{repo}/commits/{sha}/pulls``, the
first one merged). A commit no pull request merged gets no comment: its delivery ends
``delivered`` with nothing sent and says why in its ``error``.

Like the other GitHub channels it goes through the alert outbox (:mod:`.alerts`): one row per
regression (event ``culprit-comment``, target ``github-culprit:owner/name``) recorded in the
transaction that names the culprit, only when ``[github]`` is configured, and sent after the
job with the same retries and deadline. The comment's first line is a marker naming the
regression, so a retried or repeated delivery edits its comment rather than adding one. The
token is read from ``[github] token_env`` when sending and never stored.
"""

from __future__ import annotations

import dataclasses
import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.service.config import AlertsConfig, GithubConfig
from abwatch.service.notify import pull_answer
from abwatch.service.notify.channels import AlertChannel, Destinations, Sender
from abwatch.service.stats.verdict import SILENCED_TRIAGE, Direction, Metric, RegressionKind
from abwatch.service.store.models import AlertDelivery, BisectionStep, DeliveryStatus, Regression, utcnow

EVENT = "culprit-comment"
SQUASHED = re.compile(r"\(#(\d+)\)\s*$")  # "Subject (#1234)": the pull request a squash merge came from


def label(config: GithubConfig) -> str:
    """How a culprit comment's delivery names its target (the outbox's ``webhook`` column)."""
    return f"github-culprit:{config.repo}"


def marker(regression_id: int) -> str:
    """The comment's first line: how the comment of regression ``regression_id`` is found again."""
    return f"<!-- abwatch:culprit:{regression_id} -->"


def pull_number(summary: str) -> int | None:
    """The pull request a commit's summary names the way a squash merge writes it, else None."""
    found = SQUASHED.search(summary)
    return int(found[1]) if found else None


def _plain(text: str) -> str:
    """Text from the database in a comment: as :func:`pull_answer.quiet`, no code span broken."""
    return pull_answer.quiet(text.replace("`", "'"))


def comment(session: Session, regression: Regression, dashboard_url: str | None = None) -> str:
    """The comment for ``regression``'s culprit (its marker first)."""
    culprit = regression.culprit_commit
    assert culprit is not None, "a culprit comment is recorded once bisection named the culprit"
    steps = session.scalar(select(func.count()).select_from(BisectionStep)
                           .where(BisectionStep.regression_id == regression.id)) or 0
    faster = regression.direction is Direction.FASTER
    what = (f"is the cause of a {regression.change_pct:+.1f} % improvement" if faster
            else f"is the culprit of a {regression.change_pct:+.1f} % regression")
    kind, metric = RegressionKind(regression.kind).value, Metric(regression.metric or Metric.TIME).value
    device = regression.device.name if regression.device else "?"
    verify_run = (regression.verify_verdict or {}).get("run_id")
    text = (f"abwatch: commit `{culprit.sha[:12]}` \"{_plain(culprit.summary)}\" of this pull request {what} of "
            f"`{_plain(regression.workload.name)}` ({kind}, {metric}) on device `{_plain(device)}`"
            + (f", confirmed by verify run {verify_run}" if verify_run else "")
            + (f"; bisected to it in {steps} step(s)." if steps else "; the only commit of its range."))
    sub = regression.culprit_submodule_commit  # the bisection went on into the culprit's submodule bump
    if sub is not None:
        text += f" \u2192 {regression.culprit_submodule_path} `{sub.sha[:12]}` \"{_plain(sub.summary)}\""
    if dashboard_url:
        text += f" [regression #{regression.id}]({dashboard_url.rstrip('/')}/regressions/{regression.id})"
    return f"{marker(regression.id)}\n{text}"


def enqueue(session: Session, regressions: list[Regression], config: GithubConfig | None,
            dashboard_url: str | None = None) -> int:
    """Record a comment on each regression's culprit's pull request in the caller's transaction
    (the one that names the culprit); nothing without ``[github]``. A comment already recorded
    for a regression is not recorded again (a job taken up again after a crash comments once);
    regressions triaged as expected, invalid or fixed get none. Returns how many were recorded."""
    if config is None:
        return 0
    target, added = label(config), 0
    for regression in regressions:
        culprit = regression.culprit_commit
        if culprit is None or regression.triage in SILENCED_TRIAGE:
            continue
        if session.scalar(select(AlertDelivery.id).where(
                AlertDelivery.regression_id == regression.id, AlertDelivery.event == EVENT,
                AlertDelivery.webhook == target)) is not None:
            continue
        now = utcnow()
        session.add(AlertDelivery(
            regression_id=regression.id, event=EVENT, webhook=target, status=DeliveryStatus.PENDING, attempts=0,
            payload={"regression": regression.id, "sha": culprit.sha, "pr": pull_number(culprit.summary),
                     "comment": comment(session, regression, dashboard_url)},
            at=now, next_at=now))
        added += 1
    session.flush()
    return added


@dataclasses.dataclass(frozen=True)
class Posted:
    """What one attempt did: GitHub's status, and why nothing was posted (no pull request)."""

    status: int
    skipped: str | None = None


def post(config: GithubConfig, payload: dict, deadline: float, timeout_s: float) -> Posted:
    """Find the culprit's pull request and write its comment (edited if there is one already)."""
    call = pull_answer.Calls(config, deadline, timeout_s)
    number = payload.get("pr")
    if number is None:  # not a squash merge's summary: ask which merged pull request has the commit
        response = call("GET", f"/commits/{payload['sha']}/pulls?per_page=100")
        if not 200 <= response.status_code < 300:
            return Posted(response.status_code)
        answer = response.json()
        merged = [p for p in answer if isinstance(p, dict) and p.get("merged_at")] if isinstance(answer, list) else []
        if not merged:
            return Posted(response.status_code, f"skipped: no merged pull request has commit {payload['sha'][:12]}; "
                                                "nothing was posted")
        number = merged[0]["number"]
    status = pull_answer.write_comment(call, int(number), marker(payload["regression"]), payload["comment"])
    return Posted(status or 200)


class _CommentSender(Sender):
    """A culprit comment's delivery: the pull request's look-up, its comments read, one written."""

    def __init__(self, row_id: int, webhook: str, github_config: GithubConfig, document: dict,
                 config: AlertsConfig, deadline: float) -> None:
        super().__init__(row_id, webhook, github_config.api_url, b"", {}, config, deadline)
        self.github_config, self.document = github_config, document
        self.skipped: str | None = None

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        posted = post(self.github_config, self.document, self.deadline, self.config.timeout_s)
        self.skipped = posted.skipped
        return posted.status

    def run(self) -> None:
        super().run()
        if self.result is not None and self.result.ok and self.skipped:  # done, and the record says why
            self.result = dataclasses.replace(self.result, error=self.skipped)


class CulpritCommentChannel(AlertChannel):
    """A comment on the culprit's pull request (``github-culprit:owner/name``)."""

    prefix = "github-culprit:"

    def sender(self, row: AlertDelivery, destinations: Destinations, deadline: float) -> Sender | None:
        config = destinations.github
        if config is None or label(config) != row.webhook or pull_answer.headers(config) is None:
            return None
        return _CommentSender(row.id, row.webhook, config, row.payload, destinations.alerts, deadline)
