"""A local stand-in for the parts of GitHub's REST API abwatch uses with pull requests
(collaborator permission, pull requests, compare, issue comments, check runs, labels, the pull
requests of a commit), and
webhook deliveries signed the way GitHub signs them. Every request is recorded."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import git
import requests

TOKEN = "gh-pulls-token"


class GitHub(ThreadingHTTPServer):
    """Answers as GitHub does for one repository ``owner/name`` backed by a local git repo."""

    def __init__(self, repo_path, full_name: str = "acme/tvm") -> None:
        self.full_name, self.git = full_name, git.Repo(repo_path)
        self.calls: list[dict] = []
        self.permissions: dict[str, str] = {}
        self.pulls: dict[int, dict] = {}
        self.comments: dict[int, dict] = {}  # id -> {"issue", "body", "user"}
        self.checks: dict[int, dict] = {}
        self.labels: dict[int, set[str]] = {}
        self.commit_pulls: dict[str, list[dict]] = {}  # sha -> the pull requests GitHub says have it
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                parts = urlsplit(self.path)
                with server.lock:
                    server.calls.append({"method": method, "path": parts.path, "query": parse_qs(parts.query),
                                         "body": body})
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        status, answer = 401, {"message": "Bad credentials"}
                    else:
                        status, answer = server.route(method, parts.path, parse_qs(parts.query), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

            def do_PATCH(self) -> None:  # noqa: N802
                self._answer("PATCH")

            def do_DELETE(self) -> None:  # noqa: N802
                self._answer("DELETE")

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def route(self, method: str, path: str, query: dict, body) -> tuple[int, object]:
        prefix = f"/repos/{self.full_name}"
        if not path.startswith(prefix + "/"):
            return 404, {"message": "Not Found"}
        path = path.removeprefix(prefix)
        if m := re.fullmatch(r"/collaborators/([^/]+)/permission", path):
            user = unquote(m[1])
            if user not in self.permissions:
                return 404, {"message": f"{user} is not a user"}
            return 200, {"permission": self.permissions[user], "user": {"login": user}}
        if (m := re.fullmatch(r"/pulls/(\d+)", path)) and method == "GET":
            pr = self.pulls.get(int(m[1]))
            return (200, {"number": int(m[1]), "head": {"sha": pr["head"]}, "base": {"sha": pr["base"]}}) if pr \
                else (404, {"message": "Not Found"})
        if m := re.fullmatch(r"/compare/([0-9a-f]{40})\.\.\.([0-9a-f]{40})", path):
            base = self.git.merge_base(m[1], m[2])[0].hexsha
            return 200, {"merge_base_commit": {"sha": base}}
        if (m := re.fullmatch(r"/commits/([0-9a-f]{40})/pulls", path)) and method == "GET":
            return 200, self.commit_pulls.get(m[1], [])
        if path.startswith("/issues/"):
            return self._issues(method, path, body)
        return self._checks(method, path, query, body)

    def _issues(self, method: str, path: str, body) -> tuple[int, object]:
        """Comments and labels."""
        if m := re.fullmatch(r"/issues/(\d+)/comments", path):
            issue = int(m[1])
            if method == "GET":
                return 200, [{"id": i, **c} for i, c in sorted(self.comments.items()) if c["issue"] == issue]
            new = max(self.comments, default=1000) + 1
            self.comments[new] = {"issue": issue, "body": body["body"], "user": {"login": "abwatch-bot"}}
            return 201, {"id": new, **self.comments[new]}
        if (m := re.fullmatch(r"/issues/comments/(\d+)", path)) and method == "PATCH":
            self.comments[int(m[1])]["body"] = body["body"]
            return 200, {"id": int(m[1]), **self.comments[int(m[1])]}
        if (m := re.fullmatch(r"/issues/(\d+)/labels", path)) and method == "POST":
            self.labels.setdefault(int(m[1]), set()).update(body["labels"])
            return 200, [{"name": n} for n in sorted(self.labels[int(m[1])])]
        if (m := re.fullmatch(r"/issues/(\d+)/labels/([^/]+)", path)) and method == "DELETE":
            names = self.labels.setdefault(int(m[1]), set())
            if unquote(m[2]) not in names:
                return 404, {"message": "Label does not exist"}
            names.discard(unquote(m[2]))
            return 200, [{"name": n} for n in sorted(names)]
        return 404, {"message": "Not Found"}

    def _checks(self, method: str, path: str, query: dict, body) -> tuple[int, object]:
        """Check runs."""
        if (m := re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", path)) and method == "GET":
            names = query.get("check_name", [])
            runs = [{"id": i, **c} for i, c in sorted(self.checks.items())
                    if c["head_sha"] == m[1] and (not names or c["name"] == names[0])]
            return 200, {"total_count": len(runs), "check_runs": runs}
        if path == "/check-runs" and method == "POST":
            if body.get("status") == "completed" and body.get("conclusion") not in ("success", "failure", "neutral"):
                return 422, {"message": "a completed check run needs a conclusion"}
            new = max(self.checks, default=5000) + 1
            self.checks[new] = dict(body)
            return 201, {"id": new, **body}
        if (m := re.fullmatch(r"/check-runs/(\d+)", path)) and method == "PATCH":
            self.checks[int(m[1])].update(body)
            return 200, {"id": int(m[1]), **self.checks[int(m[1])]}
        return 404, {"message": "Not Found"}

    def requests_to(self, method: str, pattern: str) -> list[dict]:
        """The recorded requests of ``method`` whose path (after the repository) matches ``pattern``."""
        prefix = f"/repos/{self.full_name}"
        return [c for c in self.calls if c["method"] == method and re.fullmatch(pattern, c["path"].removeprefix(prefix))]


def deliver(url: str, secret: str | None, event: str, payload: dict | bytes, *, delivery: str | None = None,
            signature: str | None = None, timeout_s: float = 60) -> requests.Response:
    """POST one webhook delivery as GitHub does: the JSON body, ``X-GitHub-Event``,
    ``X-GitHub-Delivery`` and ``X-Hub-Signature-256`` (HMAC-SHA256 of the body with the secret)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/abc1234",
               "X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
               "X-GitHub-Hook-ID": "1"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return requests.post(url + "/api/github/webhook", data=body, headers=headers, timeout=timeout_s)


def comment_event(full_name: str, number: int, login: str, text: str, comment_id: int = 777) -> dict:
    """An ``issue_comment`` ``created`` payload on pull request ``number``, as GitHub sends it
    (trimmed); ``comment_id``: the comment's id, which GitHub signs with the rest."""
    owner = full_name.split("/")[0]
    return {
        "action": "created",
        "issue": {"number": number, "title": "Make it faster", "state": "open",
                  "pull_request": {"url": f"https://api.github.com/repos/{full_name}/pulls/{number}"},
                  "user": {"login": "contributor", "type": "User"}},
        "comment": {"id": comment_id, "body": text, "user": {"login": login, "type": "User"},
                    "author_association": "COLLABORATOR"},
        "repository": {"full_name": full_name, "html_url": f"https://github.com/{full_name}",
                       "owner": {"login": owner}},
        "sender": {"login": login, "type": "User"},
    }
