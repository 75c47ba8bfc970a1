"""``POST /api/github/webhook``: GitHub's deliveries, authenticated by their signature.

The route needs no API token (:class:`service.web.api.Guard` lets this one path through to
it); instead the body's ``X-Hub-Signature-256`` is checked against the secret in the variable
``[github] webhook_secret_env`` before anything is parsed, and a delivery without a valid one
is refused (401; 403 while the server has no secret). The body limit applies as to every
request; a delivery whose signature verifies is not rate-limited and does not wait on the
readers' turns: it has turns of its own (:class:`service.web.admission.SignedDeliveries`), so
a burst of deliveries is queued, never refused. What a delivery asks is then checked in turn,
each refusal a 4xx that queues nothing: the repository must be the configured one, the payload
well formed, the command well written, the commenter allowed
(:func:`service.watch.pulls.may_command`).

- ``issue_comment`` (created, on a pull request) with a command: ``try`` queues a ``pr`` job
  per device (202) on the head the pull request has as the comment is accepted, once per
  comment id; ``triage`` records a decision on the pull request's open regressions (200);
- ``pull_request`` (opened, synchronize, reopened) with ``[github] pr_runs = "auto"``: the same
  as ``try``, once per head sha of the payload;
- ``ping``: 200; anything else: 202, ignored.

Deduplication keys on what GitHub signs (the comment's id, the head sha), never on the
unsigned ``X-GitHub-Delivery`` header: a captured delivery sent again with a new header queues
nothing (200, ``already queued``). The delivery's work is small: a query, GitHub's answers on
the commenter and the pull request (head, merge base), one row per device; the git work waits
for the job.
"""

import logging
import os

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from abwatch.core.safejson import BadValue, loads
from abwatch.service.config import Config
from abwatch.service.watch import pulls
from abwatch.service.web.pull_commands import COMMANDS, Answer, Asked, already, parse_command, queue_run
from abwatch.service.web.pull_commands import field as _get

PATH = "/api/github/webhook"
PR_ACTIONS = frozenset({"opened", "synchronize", "reopened"})
log = logging.getLogger("abwatch.github")
router = APIRouter()


@router.post(PATH, tags=["github"], status_code=200)
async def webhook(request: Request) -> JSONResponse:
    """A GitHub delivery (see the module's docstring)."""
    config: Config | None = request.app.state.config
    github = config.github if config else None
    if config is None or github is None:
        return JSONResponse({"detail": "GitHub webhooks are not configured on this server ([github])"}, 404)
    secret = os.environ.get(github.webhook_secret_env, "")
    if not secret:
        return JSONResponse({"detail": f"GitHub webhooks are disabled: ${github.webhook_secret_env} is not "
                                       "set on the server"}, 403)
    body = await request.body()  # the body limit was applied before (Guard)
    if not pulls.verify_signature(secret, body, request.headers.get(pulls.SIGNATURE_HEADER)):
        return JSONResponse({"detail": f"a valid {pulls.SIGNATURE_HEADER} signature is required"}, 401)
    event = request.headers.get("X-GitHub-Event", "")
    delivery = request.headers.get("X-GitHub-Delivery", "")
    try:
        payload = loads(body, "webhook body")
        if not isinstance(payload, dict):
            raise Answer(422, "malformed payload: expected a JSON object")
        if not delivery or len(delivery) > 64 or not delivery.replace("-", "").isalnum():
            raise Answer(400, "X-GitHub-Delivery is missing or malformed")
        status, data = await run_in_threadpool(_handle, request, config, event, payload)
    except (ValueError, UnicodeDecodeError, BadValue) as exc:
        status, data = 400, {"detail": f"the body is not JSON: {str(exc)[:200]}"}
    except Answer as answer:
        status, data = answer.status, {"detail": answer.detail}
    except pulls.GithubApiError as exc:
        log.warning("GitHub delivery %s: %s", delivery, exc)
        return JSONResponse({"detail": str(exc)}, 503, headers={"Retry-After": "60"})
    if status >= 400:
        log.info("GitHub delivery %s (%s) refused: %s %s", delivery[:64], event[:64], status, data.get("detail"))
    return JSONResponse(data, status)


def _handle(request: Request, config: Config, event: str, payload: dict) -> tuple[int, dict]:
    """The delivery's work, in a worker thread (it waits on the database and GitHub's API)."""
    github = config.github
    assert github is not None
    if event == "ping":
        return 200, {"detail": "pong"}
    if event not in ("issue_comment", "pull_request"):
        return 202, {"detail": f"event {event[:64]!r} is not one abwatch acts on"}
    full_name = _get(payload, "repository", "full_name")
    if full_name.lower() != github.repo.lower():
        raise Answer(422, f"the delivery is for {full_name[:140]}, this server answers {github.repo}")
    if github.pr_runs == "off":
        return 202, {"detail": "pull-request runs are off ([github] pr_runs)"}
    login = _get(payload, "sender", "login")
    if _get(payload, "sender", "type") == "Bot":
        return 202, {"detail": "deliveries caused by bots are ignored"}
    if event == "pull_request":
        return _pull_request(request, config, payload, login)
    if _get(payload, "action") != "created" or not isinstance(_get(payload, "issue", kind=dict).get("pull_request"), dict):
        return 202, {"detail": "not a new comment on a pull request"}
    number = _get(payload, "issue", "number", kind=int)
    try:
        command = parse_command(_get(payload, "comment", "body"), github.command_prefix)
    except pulls.CommandError as exc:
        raise Answer(422, str(exc)) from None
    if command is None:
        return 202, {"detail": "no command in the comment"}
    comment_id = _get(payload, "comment", "id", kind=int)
    with request.app.state.api.sessions() as session:
        return COMMANDS[command.action].carry_out(Asked(session, config, command, number, login, comment_id, payload))


def _pull_request(request: Request, config: Config, payload: dict, login: str) -> tuple[int, dict]:
    """``pull_request``: opened or pushed to, with ``pr_runs = "auto"``: a run of the new head."""
    github = config.github
    assert github is not None
    action = _get(payload, "action")
    if github.pr_runs != "auto" or action not in PR_ACTIONS:
        return 202, {"detail": f"pull_request {action[:32]!r}: no automatic run ([github] pr_runs = {github.pr_runs!r})"}
    number = _get(payload, "number", kind=int)
    head, base = _get(payload, "pull_request", "head", "sha"), _get(payload, "pull_request", "base", "sha")
    if not (pulls.SHA.match(head) and pulls.SHA.match(base)):
        raise Answer(422, "malformed pull_request.head.sha or base.sha")
    with request.app.state.api.sessions() as session:
        if pulls.queued_for(session, github, number, pulls.head_key(head)):
            return already(pulls.head_key(head))
        if not pulls.may_command(github, login):
            raise Answer(403, f"{login[:40]} may not start runs: write access to {github.repo} is needed")
        return queue_run(session, config, number, head, base, pulls.Command("try"), login, pulls.head_key(head))
