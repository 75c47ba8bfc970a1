"""Pull-request commands: the words a comment may say after ``[github] command_prefix``.

Each command is a small :class:`PullCommand` registered by name in :data:`COMMANDS`: its usage,
how its words are parsed into a :class:`~abwatch.service.watch.pulls.Command` (words only,
checked against a fixed vocabulary or the config's workloads; nothing reaches a shell), and
what it does once the delivery is authenticated (:meth:`PullCommand.carry_out`, in the
webhook's worker thread with a session). A new command is one class and one line here.

- ``try [WORKLOAD...] [--verify]``: queue a ``pr`` job per watch device on the pull request's
  head as the comment is accepted, against its merge base, once per comment id (202);
- ``triage acknowledged | not-a-bug | fixed-by <sha>``: record a decision on the pull
  request's open regressions (200).

A refusal is an :class:`Answer` (a 4xx that queues nothing).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from abwatch.core.errors import UsageError
from abwatch.core.plugins import Registry
from abwatch.service.config import Config
from abwatch.service.read import triage as triage_mod
from abwatch.service.watch import pulls
from abwatch.service.watch.pulls import Command, CommandError


class Answer(Exception):
    """How a delivery is answered when it stops early (a refusal, or nothing to do)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def field(payload: Any, *path: str, kind: type = str) -> Any:
    """``payload[path...]`` of type ``kind``; a 422 naming the field otherwise."""
    value = payload
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise Answer(422, f"malformed {'.'.join(path)}: expected {kind.__name__}")
    return value


@dataclass(frozen=True)
class Asked:
    """A command as delivered: who asked, on which pull request, in which comment."""

    session: Session
    config: Config
    command: Command
    number: int
    login: str
    comment_id: int
    payload: dict


class PullCommand(abc.ABC):
    """One command word: its usage, its parse and what it does."""

    usage: ClassVar[str]  # after the prefix, e.g. "try [WORKLOAD...] [--verify]"

    @abc.abstractmethod
    def parse(self, words: list[str], usage: str) -> Command:
        """``words`` (the command word first) as a command; :class:`CommandError` with ``usage``."""

    @abc.abstractmethod
    def carry_out(self, asked: Asked) -> tuple[int, dict]:
        """Do it (the delivery is authenticated, its commenter not yet checked); (status, body)."""


def allowed(asked: Asked) -> None:
    """Refuse (403) a commenter who may not command runs (:func:`.pulls.may_command`)."""
    github = asked.config.github
    assert github is not None
    if not pulls.may_command(github, asked.login):
        raise Answer(403, f"{asked.login[:40]} may not command runs: write access to {github.repo} is needed")


def queue_run(session: Session, config: Config, number: int, head: str, base: str, command: Command,
              login: str, key: str) -> tuple[int, dict]:
    """Queue the run of ``head`` (against its merge base, as GitHub names it) under ``key``."""
    github = config.github
    assert github is not None
    merge_base = pulls.merge_base(github, base, head)
    try:
        jobs = pulls.submit(session, config, number, head, merge_base, command, f"github:{login}", key)
    except UsageError as exc:  # an unknown workload, a commit the mirror cannot find
        raise Answer(422, str(exc)) from None
    if not jobs:  # a copy of this delivery queued them a moment ago
        return already(key)
    return 202, {"jobs": [{"id": j.id, "device": j.device} for j in jobs], "control": merge_base, "treatment": head}


def already(key: str) -> tuple[int, dict]:
    """The answer to a delivery whose run was queued before (GitHub's redelivery, or a replay)."""
    return 200, {"detail": f"already queued for {key}", "jobs": []}


class Try(PullCommand):
    """``try [WORKLOAD...] [--verify]``: a run of the pull request's head on every watch device."""

    usage = "try [WORKLOAD...] [--verify]"

    def parse(self, words: list[str], usage: str) -> Command:
        rest = words[1:]
        flags = [w for w in rest if w.startswith("-")]
        if set(flags) - {"--verify"}:
            raise CommandError(f"unknown option {sorted(set(flags) - {'--verify'})[0]!r}; {usage}")
        return Command("try", tuple(dict.fromkeys(w for w in rest if not w.startswith("-"))),
                       "--verify" in flags, words=tuple(words))

    def carry_out(self, asked: Asked) -> tuple[int, dict]:
        github = asked.config.github
        assert github is not None
        key = pulls.comment_key(asked.comment_id)
        if pulls.queued_for(asked.session, github, asked.number, key):
            return already(key)  # asks GitHub nothing: a replay costs one query
        allowed(asked)
        # the head now, as the comment is accepted: the job runs this sha, whatever is pushed later
        head, base = pulls.read_pull(github, asked.number)
        return queue_run(asked.session, asked.config, asked.number, head, base, asked.command, asked.login, key)


class Triage(PullCommand):
    """``triage acknowledged | not-a-bug | fixed-by <sha>``: a decision on the open regressions."""

    usage = "triage acknowledged|not-a-bug|fixed-by <sha>"

    def parse(self, words: list[str], usage: str) -> Command:
        rest = words[1:]
        if not rest or rest[0].lower() not in pulls.TRIAGE_WORDS:
            raise CommandError(usage)
        word = rest[0].lower()
        if word == "fixed-by":
            if len(rest) != 2 or not pulls.SHA.match(rest[1].lower()):
                raise CommandError(f"`fixed-by` takes one commit sha (7 to 40 hex digits); {usage}")
            return Command("triage", triage=pulls.TRIAGE_WORDS[word], fixed_by=rest[1].lower(), words=tuple(words))
        if len(rest) != 1:
            raise CommandError(usage)
        return Command("triage", triage=pulls.TRIAGE_WORDS[word], words=tuple(words))

    def carry_out(self, asked: Asked) -> tuple[int, dict]:
        allowed(asked)
        github, command, number = asked.config.github, asked.command, asked.number
        assert github is not None and command.triage is not None
        found = pulls.open_regressions(asked.session, github, number)
        if not found:
            raise Answer(409, f"pull request #{number} has no open regression to triage")
        issue_url = None
        if command.fixed_by:
            html = field(asked.payload, "repository", "html_url")
            issue_url = f"{html.rstrip('/')}/commit/{command.fixed_by}" if html.startswith("https://") else None
        for regression in found:
            triage_mod.triage(asked.session, regression.id, command.triage, who=f"github:{asked.login}",
                              issue_url=issue_url, note=command.note(), fixed_by=command.fixed_by)
        pulls.announce(asked.session, asked.config, number)
        asked.session.commit()
        return 200, {"triaged": [r.id for r in found], "as": command.triage.value, "fixed_by": command.fixed_by}


COMMANDS: Registry[PullCommand] = Registry("pull-request command", [("try", Try()), ("triage", Triage())])


def usage(prefix: str) -> str:
    """How each registered command is written."""
    return "usage: " + " or ".join(f"`{prefix} {c.usage}`" for c in COMMANDS.values())


def parse_command(text: str, prefix: str) -> Command | None:
    """The command in a comment's first line that begins with ``prefix``; None if no line does."""
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].lower() != prefix.lower():
            continue
        if len(words) > pulls.WORDS_MAX:
            raise CommandError(f"{prefix}: at most {pulls.WORDS_MAX} words")
        words = words[1:]
        command = COMMANDS.get(words[0].lower(), None) if words else None
        if command is None:
            raise CommandError(usage(prefix))
        return command.parse(words, usage(prefix))
    return None
