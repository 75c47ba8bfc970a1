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
and the label. While the job runs, :class:`PullProgress` edits the same comment as it goes: after
each side's build, when measuring starts and as each workload is measured, at most one edit per
stage or per ``EDIT_EVERY_S`` seconds, each sent at once (between the job's steps, never while
a process is timed), a state not yet sent replaced rather than queued twice.

Nothing from a comment, a branch or a payload reaches a shell: a command is split on white
space and each word is checked against the config's workloads or a fixed vocabulary; shas are
hex. The commands themselves are plug-ins (:mod:`service.web.pull_commands`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from abwatch.service.config import Config, GithubConfig
from abwatch.service.compare import driver
from abwatch.service.compare import progress as stages
from abwatch.service.notify import alerts, pull_answer
from abwatch.service.notify.channels import Destinations
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
EDIT_EVERY_S = 20.0  # a running job's comment is edited at most this often within one stage


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


class PullProgress:
    """A ``pr`` job's progress: every message and tick to ``inner`` (the worker's log), and the
    job's stages (:class:`service.compare.progress.Stage`) said in the pull request's comment.

    Each stage (a side built, measuring begun, a run begun) is sent when it happens; workloads
    measured within one stage at most once per ``every_s`` (a later one sends what waited), the
    last of them always.
    A send commits an outbox row in a session of its own (the job's transaction is left alone)
    and delivers that row at once; a failure to record or send is logged and never fails the job.
    """

    def __init__(self, engine: Engine, config: Config, job: Job, inner: driver.Progress, *,
                 every_s: float = EDIT_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine, self.config, self.inner, self.every_s, self.clock = engine, config, inner, every_s, clock
        self.job_id, self.number = job.id, job.payload["pr"]
        self.steps: list[str] = []
        self.measured: list[str] = []  # the workloads measured in this measuring, and what each said
        self.measured_at: int | None = None  # their line in ``steps``
        self.runs = 0
        self.kind: tuple[str, str] | None = None
        self.sent_at: float | None = None

    def message(self, text: str) -> None:
        """The worker's log."""
        self.inner.message(text)

    def invocation(self, workload: str, done: int, total: int) -> None:
        """The worker's log."""
        self.inner.invocation(workload, done, total)

    def stage(self, event: stages.Stage) -> None:
        """Note ``event`` in the comment's lines and send them when the stage is new or time is up."""
        if event.kind == stages.RUN:
            self.runs += 1
            if self.runs > 1:  # the verification's run: its own lines under the first run's
                self.steps.append(f"{event.what} run {event.run_id}")
        elif event.kind == stages.BUILT:
            self.steps.append(f"{event.side} {event.sha[:12]}: {event.what}")
        elif event.kind == stages.MEASURING:
            self.steps.append(f"measuring {event.total} workload(s)")
            self.measured, self.measured_at = [], None
        elif event.kind == stages.MEASURED:
            self.measured.append(f"{event.workload} {event.what}")
            line = f"{event.done} of {event.total} workload(s) measured: {', '.join(self.measured)}"
            if event.done == event.total:
                line += " (the verdicts, adjusted for their number, when the job ends)"
            if self.measured_at is None:
                self.measured_at = len(self.steps)
                self.steps.append(line)
            else:
                self.steps[self.measured_at] = line
        else:
            return
        kind = (event.kind, event.side)
        last = event.kind == stages.MEASURED and event.done == event.total  # the stage's end: sent
        if kind != self.kind or last or self.sent_at is None or self.clock() - self.sent_at >= self.every_s:
            self.kind = kind
            self.send()

    def send(self) -> None:
        """Record the comment's new state (replacing one not sent yet) and deliver it now."""
        github = self.config.github
        if github is None:
            return
        self.sent_at = self.clock()
        try:
            with Session(self.engine) as session:
                row = pull_answer.enqueue(session, github, self.number, self.config.alerts.dashboard_url,
                                          steps={self.job_id: list(self.steps)}, replace=True)
                session.commit()
                row_id = row.id if row is not None else None
            if row_id is not None:
                for sent in alerts.deliver_pending(self.engine, Destinations(self.config.alerts, github), ids=[row_id]):
                    if not sent.ok:
                        self.inner.message(f"pull request #{self.number}: the comment was not edited ({sent.error}); "
                                           "it is sent again later")
        except Exception as exc:  # the comment is a courtesy; the job goes on
            if db.lost_connection(exc) is not None:
                raise
            self.inner.message(f"pull request #{self.number}: the comment's progress was not recorded "
                               f"({type(exc).__name__}: {exc})")


def run_pr(session: Session, config: Config, job: Job, progress: driver.Progress | None = None) -> dict:
    """The ``pr`` job: a try job's comparison (and verification), then the pull request's state
    in the outbox, committed with the job's end (or on its own when the job failed). While it
    runs, :class:`PullProgress` edits the pull request's comment as it builds and measures."""
    number = job.payload["pr"]
    job_id = job.id
    told = PullProgress(driver.engine_of(session), config, job, progress or driver.NullProgress())
    try:
        result = tryjob.run_try(session, config, job, told)
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
