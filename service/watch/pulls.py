"""Performance runs asked for from a pull request, and answered in it.

GitHub delivers webhooks (``POST /api/github/webhook``, :mod:`service.web.github_hooks`) signed
with the shared secret; a comment whose line begins with ``[github] command_prefix``::

    @abwatch try [WORKLOAD...] [--verify]
    @abwatch triage acknowledged | not-a-bug | fixed-by <sha>

from a person with write access (or one on ``[github] allow``) queues a ``pr`` job per watch
device (:func:`submit`): the pull request's head against its merge base, run like a person's
try job (:func:`service.watch.tryjob.run_try`). With ``pr_runs = "auto"`` opening or pushing to a
pull request does the same. When the job is queued and when it ends, :func:`run_pr` records the
pull request's new state in the outbox (:mod:`service.notify.pull_answer`): the comment, the check run
and the label.

Nothing from a comment, a branch or a payload reaches a shell: a command is split on white
space and each word is checked against the config's workloads or a fixed vocabulary; shas are
hex. The commands themselves are plug-ins (:mod:`service.web.pull_commands`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.config import Config, GithubConfig
from abwatch.service.compare import driver
from abwatch.service.notify import pull_answer
from abwatch.service.stats.verdict import TriageStatus
from abwatch.service.store import db
from abwatch.service.store.models import Job, JobStatus, Regression
from abwatch.service.watch import queue, tryjob
from abwatch.service.watch.device_config import device_names

KIND = pull_answer.KIND
SIGNATURE_HEADER = "X-Hub-Signature-256"
WRITERS = frozenset({"admin", "maintain", "write"})
TRIAGE_WORDS = {"acknowledged": TriageStatus.ACKNOWLEDGED, "not-a-bug": TriageStatus.INVALID,
                "fixed-by": TriageStatus.FIXED}
SHA = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")
WORDS_MAX = 64  # words of one command


# the reads of GitHub's API the webhook needs (service.notify.pull_answer holds the API's client)
GithubApiError = pull_answer.GithubApiError
read_pull = pull_answer.pull
merge_base = pull_answer.merge_base


class CommandError(ValueError):
    """A command line that cannot be carried out as written (its message says how to write it)."""


@dataclass(frozen=True)
class Command:
    """One parsed command: ``try`` (workloads, verify) or ``triage`` (status, fixing sha)."""

    action: str
    workloads: tuple[str, ...] = ()
    verify: bool = False
    triage: TriageStatus | None = None
    fixed_by: str | None = None
    words: tuple[str, ...] = field(default=(), compare=False)

    def note(self) -> str:
        """The triage event's note."""
        return f"fixed by {self.fixed_by}" if self.fixed_by else f"{self.triage.value if self.triage else ''} on GitHub"


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """GitHub's ``X-Hub-Signature-256``: ``sha256=`` and the HMAC-SHA256 of the exact body,
    compared in constant time."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), (header or "").encode())


def may_command(config: GithubConfig, login: str, timeout_s: float = 10.0) -> bool:
    """Whether ``login`` may command runs: on ``[github] allow``, or with write access to the
    repository as GitHub's API says (:func:`service.notify.pull_answer.permission`)."""
    if not LOGIN.match(login):
        return False
    if login.lower() in {name.lower() for name in config.allow}:
        return True
    return pull_answer.permission(config, login, timeout_s) in WRITERS


def submit(session: Session, config: Config, number: int, head: str, merge_base: str, command: Command,
           who: str, request_key: str) -> list[Job]:
    """Queue one ``pr`` job per watch device (the head against the merge base) and record the
    pull request's new state in the outbox; commit.

    ``head`` is the sha the pull request had when the request was accepted, and the job runs
    that sha even if the branch moves before a worker is free (a later push is a later
    request). ``request_key`` is what GitHub signed (:func:`comment_key`, :func:`head_key`),
    so a delivery sent again, by GitHub or by whoever captured it, queues nothing twice. The
    shas are checked here but resolved by the job (:func:`.tryjob.run_try`): a delivery does no
    git work."""
    github = config.github
    assert github is not None, "pull-request runs need [github]"
    names = {w.name for w in config.workloads}
    unknown = [w for w in command.workloads if w not in names]
    if unknown:
        raise tryjob.TryError(f"unknown workload(s) {', '.join(unknown[:10])} (the config has: "
                              f"{', '.join(sorted(names))})")
    for what, sha in (("head", head), ("merge base", merge_base)):
        if not FULL_SHA.match(sha):
            raise tryjob.TryError(f"the pull request's {what} {sha[:64]!r} is not a full commit sha")
    payload = {"control": merge_base, "treatment": head, "control_ref": f"merge base of #{number}",
               "treatment_ref": f"pull/{number}/head", "workloads": sorted(command.workloads),
               "verify": command.verify, "who": who, "pr": number, "repo": github.repo}
    jobs = []
    for device in device_names(config):
        job = queue.enqueue(session, KIND, device, payload, f"{pull_answer.job_key(github, number)}{request_key}:{device}")
        if job is not None:
            jobs.append(job)
    if jobs:
        pull_answer.enqueue(session, github, number, config.alerts.dashboard_url)
    session.commit()
    return jobs


def comment_key(comment_id: int) -> str:
    """The part of a ``pr`` job's dedupe key that names the comment that asked for it (its id,
    which GitHub signs): one comment is one run, however often it is delivered."""
    return f"comment-{comment_id}"


def head_key(head: str) -> str:
    """The part of an automatic run's dedupe key: the head sha from the signed payload."""
    return f"auto-{head}"


def queued_for(session: Session, config: GithubConfig, number: int, request_key: str) -> bool:
    """Whether a job of pull request ``number`` was queued for ``request_key`` already."""
    prefix = f"{pull_answer.job_key(config, number)}{request_key}:"
    return session.scalar(select(Job.id).where(Job.dedupe_key.startswith(prefix, autoescape=True)).limit(1)) is not None


def open_regressions(session: Session, config: GithubConfig, number: int) -> list[Regression]:
    """The open regressions of the pull request's newest runs (what a triage command decides)."""
    runs = [j.result["run_id"] for j in pull_answer.current_jobs(session, config, number) if j.result and j.result.get("run_id")]
    return [r for r in pull_answer.pr_regressions(session, runs) if r.state in pull_answer.OPEN_STATES]


def announce(session: Session, config: Config, number: int) -> None:
    """Record the pull request's state now in the outbox (after a triage), in the caller's transaction."""
    pull_answer.enqueue(session, config.github, number, config.alerts.dashboard_url)


def run_pr(session: Session, config: Config, job: Job, progress: driver.Progress | None = None) -> dict:
    """The ``pr`` job: a try job's comparison (and verification), then the pull request's state
    in the outbox, committed with the job's end (or on its own when the job failed)."""
    number = job.payload["pr"]
    job_id = job.id
    try:
        result = tryjob.run_try(session, config, job, progress)
    except Exception as exc:
        if db.lost_connection(exc) is not None:
            raise  # nothing can be recorded now; the job is queued again once its lock is free
        session.rollback()
        pull_answer.enqueue(session, config.github, number, config.alerts.dashboard_url,
                      {job_id: (JobStatus.FAILED, None, f"{type(exc).__name__}: {exc}")})
        session.commit()
        raise
    pull_answer.enqueue(session, config.github, number, config.alerts.dashboard_url, {job_id: (JobStatus.DONE, result, None)})
    return result
