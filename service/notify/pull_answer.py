"""A pull request's answer on GitHub: one comment (edited as results arrive), one check run and
the regression label, all from the rows the pull request's jobs left. Under each device's table,
each regression's explanation (:mod:`service.store.explain`): the five functions whose
instructions grew most, or the five operators whose time changed most.

:func:`render` reads a pull request's ``pr`` jobs (:mod:`service.watch.pulls`), their runs'
comparisons and the regressions they opened, and says what GitHub should show: the comment's
Markdown (a table per device), the check run (``in_progress`` until every device's job ended,
then ``failure`` on an untriaged regression, ``neutral`` when something could not be judged or
a regression was triaged, else ``success``) and whether the label is on.

:func:`enqueue` records that as one outbox row (``alert_deliveries``, event ``pull``, target
``github-pr:owner/name``) in the caller's transaction, and gives up the pull request's older
rows that were not sent yet: only its newest state is worth sending. :func:`sync` is what the
outbox's sender does with a row (:mod:`.alerts`): find abwatch's comment by its first line and
edit it (or create it), find the check run by name on the head commit and update it (or create
it), add or remove the label. Each step is idempotent, so a retried delivery changes nothing
twice. The token is read from ``[github] token_env`` when sending and never stored. Check runs
can only be written with a GitHub App's installation token.

:func:`permission`, :func:`pull` and :func:`merge_base` are the reads the webhook needs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.config import AlertsConfig, GithubConfig
from abwatch.service.notify import explained
from abwatch.service.notify.channels import AlertChannel, Destinations, Sender
from abwatch.service.stats.verdict import Direction, Metric, RegressionKind, RegressionState, Verdict
from abwatch.service.store import explain
from abwatch.service.store.models import (
    AlertDelivery, Comparison, DeliveryStatus, Job, JobStatus, Regression, utcnow,
)

EVENT = "pull"
KIND = "pr"  # the job kind of a pull request's comparison (service.watch.pulls)
MARKER = "<!-- abwatch:pull-request -->"  # the first line of abwatch's comment: how it is found again
OPEN_STATES = (RegressionState.BENCHMARK, RegressionState.VERIFY, RegressionState.REGRESS)
SUMMARY_MAX = 60_000  # GitHub's check run output holds 65 535 characters
PAGES_MAX = 20  # comment pages read when looking for abwatch's comment (100 a page)
API_VERSION = "2022-11-28"


class GithubApiError(RuntimeError):
    """GitHub's API could not answer a read the webhook needs (unreachable, 5xx, no token)."""


def label(config: GithubConfig) -> str:
    """How a pull request's delivery names its target (the outbox's ``webhook`` column)."""
    return f"github-pr:{config.repo}"


def job_key(config: GithubConfig, number: int) -> str:
    """The start of the dedupe key of every job of pull request ``number``."""
    return f"{KIND}:{config.repo}#{number}:"


def headers(config: GithubConfig) -> dict[str, str] | None:
    """The API's headers with the token; None while ``token_env`` is unset."""
    token = os.environ.get(config.token_env)
    if not token:
        return None
    return {"Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",
            "X-GitHub-Api-Version": API_VERSION, "User-Agent": "abwatch-pulls"}


def _repo_url(config: GithubConfig) -> str:
    return f"{config.api_url.rstrip('/')}/repos/{config.repo}"


# --- the reads the webhook needs --------------------------------------------------------------

def _get(config: GithubConfig, path: str, timeout_s: float) -> requests.Response:
    sent = headers(config)
    if sent is None:
        raise GithubApiError(f"the GitHub API cannot be asked: ${config.token_env} is not set on the server")
    try:
        response = requests.get(_repo_url(config) + path, headers=sent, timeout=timeout_s, allow_redirects=False)
    except requests.RequestException as exc:
        raise GithubApiError(f"the GitHub API did not answer ({type(exc).__name__})") from None
    if response.status_code >= 500 or response.status_code in (401, 403, 429):
        raise GithubApiError(f"the GitHub API answered HTTP {response.status_code} to GET {path}")
    return response


def permission(config: GithubConfig, login: str, timeout_s: float = 10.0) -> str:
    """``login``'s permission on the repository: admin, maintain, write, triage, read or none."""
    response = _get(config, f"/collaborators/{quote(login, safe='')}/permission", timeout_s)
    if response.status_code == 404:  # not a user, or not one the repository knows
        return "none"
    data = _json(response, "the collaborator permission")
    role = data.get("role_name") or data.get("permission")
    return role if isinstance(role, str) else "none"


@dataclass(frozen=True)
class PullRequest:
    """What a run of a pull request needs: its number, head and merge base."""

    number: int
    head_sha: str
    base_sha: str
    merge_base: str


def pull(config: GithubConfig, number: int, timeout_s: float = 10.0) -> tuple[str, str]:
    """(head sha, base sha) of pull request ``number``."""
    response = _get(config, f"/pulls/{number}", timeout_s)
    if response.status_code != 200:
        raise GithubApiError(f"pull request #{number} could not be read (HTTP {response.status_code})")
    data = _json(response, f"pull request #{number}")
    try:
        return str(data["head"]["sha"]), str(data["base"]["sha"])
    except (KeyError, TypeError):
        raise GithubApiError(f"pull request #{number}: the answer names no head or base sha") from None


def merge_base(config: GithubConfig, base: str, head: str, timeout_s: float = 10.0) -> str:
    """The merge base of ``head`` and ``base``, as GitHub's compare endpoint names it."""
    response = _get(config, f"/compare/{base}...{head}", timeout_s)
    if response.status_code != 200:
        raise GithubApiError(f"GitHub could not compare {base[:12]}...{head[:12]} (HTTP {response.status_code})")
    sha = (_json(response, "the comparison").get("merge_base_commit") or {}).get("sha")
    if not isinstance(sha, str):
        raise GithubApiError(f"GitHub's comparison of {base[:12]}...{head[:12]} names no merge base")
    return sha


def _json(response: requests.Response, what: str) -> dict:
    try:
        data = response.json()
    except ValueError:
        raise GithubApiError(f"the GitHub API's answer for {what} is not JSON") from None
    if not isinstance(data, dict):
        raise GithubApiError(f"the GitHub API's answer for {what} is not an object")
    return data


# --- what the pull request shows ---------------------------------------------------------------

def pr_jobs(session: Session, config: GithubConfig, number: int) -> list[Job]:
    """Every job of pull request ``number``, oldest first."""
    jobs = session.scalars(select(Job).where(Job.kind == KIND, Job.dedupe_key.startswith(job_key(config, number)))
                           .order_by(Job.id)).all()
    return [j for j in jobs if j.payload.get("pr") == number and j.payload.get("repo") == config.repo]


def current_jobs(session: Session, config: GithubConfig, number: int) -> list[Job]:
    """The jobs that speak for pull request ``number`` now: on its newest head, the newest job
    of each device (a later request on the same head replaces an earlier one), by device."""
    jobs = pr_jobs(session, config, number)
    if not jobs:
        return []
    head = jobs[-1].payload["treatment"]
    newest = {job.device: job for job in jobs if job.payload["treatment"] == head}
    return [newest[d] for d in sorted(newest)]


def pr_regressions(session: Session, runs: list[int]) -> list[Regression]:
    """The regressions the comparison runs ``runs`` (of a pull request's jobs) opened."""
    if not runs:
        return []
    return list(session.scalars(select(Regression).where(Regression.run_id.in_(runs), Regression.direction == Direction.SLOWER)
                               .order_by(Regression.id)))


def _active(r: Regression) -> bool:
    """An untriaged regression that is still open: the label's reason."""
    return r.state in OPEN_STATES and r.triage is None


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}%"


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f} {unit}" if unit == "instructions" else f"{value:.3f} {unit}"


def _link(dashboard_url: str | None, run_id: int) -> str:
    return f"[run {run_id}]({dashboard_url.rstrip('/')}/runs/{run_id})" if dashboard_url else f"run {run_id}"


def _verdict(c: Comparison) -> Verdict | None:
    stored = (c.details or {}).get("verdict")
    return Verdict.from_dict(stored) if isinstance(stored, dict) else None


def quiet(text: str) -> str:
    """Text from the database in a GitHub comment: one line, no mentions, at most 200 characters."""
    return text.replace("\n", " ").replace("@", "@\u200b")[:200]


def _cell(text: str) -> str:
    """Text from the database in a Markdown table cell: no pipes, no line breaks, no mentions."""
    return quiet(text.replace("|", "\\|"))


def _device_section(session: Session, job: Job, status: JobStatus, result: dict | None, error: str | None,
                    regressions: dict[int, Regression], dashboard_url: str | None,
                    steps: list[str] | None = None) -> list[str]:
    lines = [f"#### {_cell(job.device)}", ""]
    if status in (JobStatus.QUEUED, JobStatus.RUNNING):
        # what will run, said as the command is accepted; edited as the job builds and measures
        # (``steps``: service.watch.pulls.PullProgress) and when it ends
        what = ", ".join(f"`{_cell(w)}`" for w in job.payload.get("workloads") or []) or "every workload"
        verify = "; a suspected regression is verified" if job.payload.get("verify") else ""
        said = [f"{'Queued' if status == JobStatus.QUEUED else 'Running'} (job {job.id}): {what}{verify}. "
                "This comment is edited with the verdicts when the job ends.", ""]
        if steps:
            said += [f"- {_cell(step)}" for step in steps] + [""]
        return lines + said
    if status == JobStatus.FAILED or not result or not result.get("run_id"):
        first = (error or "no result").splitlines()[0] if (error or "").strip() else "no result"
        return lines + [f"Job {job.id} failed: {_cell(first)}", ""]
    run_id = result["run_id"]
    lines += ["| workload | metric | verdict | change | interval | control | treatment | run |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in session.scalars(select(Comparison).where(Comparison.run_id == run_id).order_by(Comparison.id)):
        v = _verdict(c)
        unit = v.unit if v else "ms"
        metric = {"ms": "time", "cpu ms": "CPU time"}.get(unit, unit)
        verdict = c.verdict.value
        r = regressions.get(c.workload_id)
        if r is not None:
            verdict += {RegressionState.REGRESS: " (confirmed)", RegressionState.CLEARED: " (cleared by verify)",
                        RegressionState.FIXED: " (fixed)"}.get(r.state, " (suspected)")
            if r.triage is not None:
                verdict += f", triaged {r.triage.value}" + (f" by {r.fixed_by[:12]}" if r.fixed_by else "")
        ci = f"[{c.ci_low_pct:+.2f}%, {c.ci_high_pct:+.2f}%]" if c.ci_low_pct is not None and c.ci_high_pct is not None else "–"
        control = v.control_ms if v and v.control_ms is not None else c.control_median_ms
        treatment = v.treatment_ms if v and v.treatment_ms is not None else c.treatment_median_ms
        if c.error:
            verdict += f": {_cell(c.error.splitlines()[0] if c.error.strip() else '')}"
        lines.append(f"| {_cell(c.workload.name)} | {metric} | **{verdict}** | {_pct(c.change_pct)} | {ci} | "
                     f"{_figure(control, unit.removeprefix('cpu '))} | {_figure(treatment, unit.removeprefix('cpu '))} | "
                     f"{_link(dashboard_url, run_id)} |")
    if result.get("verify_run_id"):
        lines += ["", f"Verified by {_link(dashboard_url, result['verify_run_id'])}."]
    for r in pr_regressions(session, [run_id]):  # what explains each regression: its top five
        if RegressionKind(r.kind) is not RegressionKind.CORRECTNESS:
            kind, metric = RegressionKind(r.kind).value, Metric(r.metric or Metric.TIME).value
            lines += ["", f"**{_cell(r.workload.name)}**, {kind} regression on {metric}:", ""]
            lines += explained.markdown_lines(explain.of_regression(session, r), _cell)
    return lines + [""]


def render(session: Session, config: GithubConfig, number: int, dashboard_url: str | None = None,
           ending: dict[int, tuple[JobStatus, dict | None, str | None]] | None = None,
           steps: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """What pull request ``number`` should show now (the outbox row's payload). ``ending``: the
    state of jobs that are ending in the caller's transaction (job id -> status, result, error);
    ``steps``: what a running job did so far (job id -> lines: built, measuring, measured)."""
    ending, steps = ending or {}, steps or {}
    shown = current_jobs(session, config, number)
    if not shown:
        raise ValueError(f"pull request #{number} of {config.repo} has no abwatch jobs")
    head = shown[0].payload["treatment"]

    def state(job: Job) -> tuple[JobStatus, dict | None, str | None]:
        return ending.get(job.id) or (job.status, job.result, job.error)

    finished = [(job, *state(job)) for job in shown]
    regressions = pr_regressions(session, [r["run_id"] for _, _, r, _ in finished if r and r.get("run_id")])
    by_workload = {(r.run_id, r.workload_id): r for r in regressions if r.kind.value == "runtime"}
    active = [r for r in regressions if _active(r)]
    control = shown[0].payload["control"]
    body = [MARKER, f"### abwatch: {head[:12]} against its merge base {control[:12]}", ""]
    for job, status, result, error in finished:
        run_id = (result or {}).get("run_id")
        mine = {wid: r for (rid, wid), r in by_workload.items() if rid == run_id}
        body += _device_section(session, job, status, result, error, mine, dashboard_url, steps.get(job.id))
    running = any(status in (JobStatus.QUEUED, JobStatus.RUNNING) for _, status, _, _ in finished)
    unjudged = any(status == JobStatus.FAILED or (result or {}).get("status") != "completed"
                   or "unknown" in (result or {}).get("verdicts", {}).values()
                   for _, status, result, _ in finished)
    triaged = any(r.triage is not None for r in regressions)
    if running:
        conclusion, title = None, f"measuring on {sum(s in (JobStatus.QUEUED, JobStatus.RUNNING) for _, s, _, _ in finished)} device(s)"
    elif active:
        conclusion, title = "failure", f"{len(active)} regression(s): " + ", ".join(
            f"{r.workload.name} {r.change_pct:+.2f}%" for r in active[:5])
    elif unjudged or triaged:
        conclusion, title = "neutral", ("regressions triaged" if triaged and not unjudged else "not every workload could be judged")
    else:
        conclusion, title = "success", "no regression"
    if active:
        body += [f"Untriaged regressions are labelled `{config.label}`. To record a decision, comment "
                 f"`{config.command_prefix} triage acknowledged`, `... not-a-bug` or `... fixed-by <sha>`.", ""]
    text = "\n".join(body)
    return {"pr": number, "repo": config.repo, "head_sha": head, "comment": text, "label": bool(active),
            "check": {"name": config.context, "status": "in_progress" if running else "completed",
                      "conclusion": conclusion, "title": title[:200], "summary": text[:SUMMARY_MAX]}}


def enqueue(session: Session, config: GithubConfig | None, number: int, dashboard_url: str | None = None,
            ending: dict[int, tuple[JobStatus, dict | None, str | None]] | None = None,
            steps: dict[int, list[str]] | None = None, *, replace: bool = False) -> AlertDelivery | None:
    """Record pull request ``number``'s state now as an outbox row in the caller's transaction,
    giving up its older rows not sent yet; None without ``[github]``. ``replace`` (a running
    job's progress): a row of the pull request still waiting for its first attempt, and not
    claimed by a sender, takes the new state in place of a second row."""
    if config is None:
        return None
    document = render(session, config, number, dashboard_url, ending, steps)
    target = label(config)
    now = utcnow()
    if replace:
        query = (select(AlertDelivery).where(AlertDelivery.event == EVENT, AlertDelivery.webhook == target,
                                             AlertDelivery.status == DeliveryStatus.PENDING,
                                             AlertDelivery.attempts == 0, AlertDelivery.next_at <= now)
                 .order_by(AlertDelivery.id.desc()))
        if session.get_bind().dialect.name == "postgresql":
            query = query.with_for_update(skip_locked=True)  # one a sender is claiming is left to it
        waiting = next((r for r in session.scalars(query) if r.payload.get("pr") == number), None)
        if waiting is not None:
            waiting.payload, waiting.at = document, now
            session.flush()
            return waiting
    row = AlertDelivery(regression_id=None, event=EVENT, webhook=target, status=DeliveryStatus.PENDING,
                        attempts=0, payload=document, at=now, next_at=now)
    session.add(row)
    session.flush()
    for older in session.scalars(select(AlertDelivery).where(
            AlertDelivery.event == EVENT, AlertDelivery.webhook == target, AlertDelivery.id < row.id,
            AlertDelivery.status == DeliveryStatus.PENDING)):
        if older.payload.get("pr") == number:
            older.status, older.next_at = DeliveryStatus.GIVEN_UP, None
            older.error = f"superseded by delivery {row.id}: the pull request's newer state"
    session.flush()
    return row


# --- sending (the outbox's sender calls this) --------------------------------------------------

class Calls:
    """The requests of one delivery (a sync, a culprit's comment), each within what is left of the round's deadline."""

    def __init__(self, config: GithubConfig, deadline: float, timeout_s: float) -> None:
        self.base, self.deadline, self.timeout_s = _repo_url(config), deadline, timeout_s
        self.headers = headers(config) or {}

    def __call__(self, method: str, path: str, body: dict | None = None, url: str | None = None) -> requests.Response:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left in this round")
        timeout = min(self.timeout_s, left)
        data = None if body is None else json.dumps(body, sort_keys=True).encode()
        sent = {**self.headers, **({"Content-Type": "application/json"} if data is not None else {})}
        return requests.request(method, url or self.base + path, data=data, headers=sent,
                                timeout=(timeout, timeout), allow_redirects=False)


def _failed(response: requests.Response, *ok: int) -> int | None:
    """The status to report if ``response`` did not succeed (2xx or one of ``ok``)."""
    return None if 200 <= response.status_code < 300 or response.status_code in ok else response.status_code


def write_comment(call: Calls, number: int, marker: str, body: str) -> int | None:
    """Edit the comment of issue (or pull request) ``number`` whose body starts with ``marker``,
    or create it if there is none: a retried delivery never comments twice. Returns the HTTP
    status of the request GitHub refused, else None."""
    comment_id, url = None, None
    for _ in range(PAGES_MAX):
        response = call("GET", f"/issues/{number}/comments?per_page=100", url=url)
        if (status := _failed(response)) is not None:
            return status
        found = [c for c in response.json() if isinstance(c, dict) and str(c.get("body", "")).startswith(marker)]
        if found:
            comment_id = found[0]["id"]
            break
        url = response.links.get("next", {}).get("url")
        if not url:
            break
    if comment_id is None:
        response = call("POST", f"/issues/{number}/comments", {"body": body})
    else:
        response = call("PATCH", f"/issues/comments/{comment_id}", {"body": body})
    return _failed(response)


def sync(config: GithubConfig, payload: dict, deadline: float, timeout_s: float) -> int:
    """Make pull request ``payload['pr']`` show ``payload``: the comment, the check run and the
    label. Returns the HTTP status of the first step GitHub refused, else 200."""
    call, number = Calls(config, deadline, timeout_s), payload["pr"]
    if (status := write_comment(call, number, MARKER, payload["comment"])) is not None:
        return status
    check = payload["check"]
    response = call("GET", f"/commits/{payload['head_sha']}/check-runs?check_name={quote(check['name'])}")
    if (status := _failed(response)) is not None:
        return status
    runs = [r for r in response.json().get("check_runs", []) if r.get("name") == check["name"]]
    body: dict[str, Any] = {"name": check["name"], "status": check["status"],
                            "output": {"title": check["title"], "summary": check["summary"]}}
    if check["conclusion"]:
        body["conclusion"] = check["conclusion"]
    if runs:
        response = call("PATCH", f"/check-runs/{runs[0]['id']}", body)
    else:
        response = call("POST", "/check-runs", {**body, "head_sha": payload["head_sha"]})
    if (status := _failed(response)) is not None:
        return status
    if payload["label"]:
        response = call("POST", f"/issues/{number}/labels", {"labels": [config.label]})
    else:  # 404: the label was not on the pull request
        response = call("DELETE", f"/issues/{number}/labels/{quote(config.label, safe='')}")
    return _failed(response, 404) or 200


class _PullSync(Sender):
    """A pull request's delivery: several requests (:func:`sync`) in place of one POST."""

    def __init__(self, row_id: int, webhook: str, github_config: GithubConfig, document: dict,
                 config: AlertsConfig, deadline: float) -> None:
        super().__init__(row_id, webhook, github_config.api_url, b"", {}, config, deadline)
        self.github_config, self.document = github_config, document

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        return sync(self.github_config, self.document, self.deadline, self.config.timeout_s)


class PullRequestChannel(AlertChannel):
    """A pull request's comment, check run and label (``github-pr:owner/name``), kept in step."""

    prefix = "github-pr:"

    def sender(self, row: AlertDelivery, destinations: Destinations, deadline: float) -> Sender | None:
        config = destinations.github
        if config is None or label(config) != row.webhook or headers(config) is None:
            return None
        return _PullSync(row.id, row.webhook, config, row.payload, destinations.alerts, deadline)
