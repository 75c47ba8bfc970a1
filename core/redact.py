"""Credentials never leave abwatch: URLs are masked wherever they are printed or stored."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
# Query parameters that carry a credential (GitLab's private_token, S3 signatures, ...).
_SECRET_PARAM = re.compile(r"token|key|secret|passw|pwd|auth|sig|credential", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with its password (or a lone token in the user part) replaced by ``***``.

    ``https://user:token@host/x`` → ``https://user:***@host/x``;
    ``https://token@host/x`` → ``https://***@host/x``; paths and scp-style
    ``git@host:repo`` (no secret in them) are returned unchanged. Query parameters named
    like a credential (``?private_token=...``) are masked too.

    This is also a repository's stored identity (:func:`abwatch.service.store.rows.get_repository`):
    one repository reached with different credentials is one row.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True) if parts.scheme not in ("", "file") else []
    if any(_SECRET_PARAM.search(key) for key, _ in query):  # rewritten only then: the rest stays as given
        parts = parts._replace(query=urlencode(
            [(key, MASK if _SECRET_PARAM.search(key) else value) for key, value in query], safe="*"))
        url = urlunsplit(parts)
    if not parts.scheme or "@" not in parts.netloc or parts.scheme == "file":
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if colon:
        userinfo = f"{user}:{MASK}"
    elif parts.scheme in ("http", "https"):  # a bare user part over HTTP is a token
        userinfo = MASK
    else:  # ssh://git@host: a user name, not a secret
        return url
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))


def redact_endpoint(url: str) -> str:
    """How a URL whose path may itself be the secret (a Slack or Discord webhook) is stored and
    shown: scheme and host, then a short hash of the whole URL that tells two endpoints apart.

    ``https://hooks.slack.com/services/T0/B0/XYZ`` → ``https://hooks.slack.com/…#3f2a9c1e``.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        host, port, parts = "", "", None
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    scheme = parts.scheme if parts is not None and parts.scheme else "url"
    return f"{scheme}://{host}{port}/\u2026#{digest}"


# The variables whose values are secrets wherever abwatch runs; a config adds the ones it names
# (server.token_env, alerts.secret_env, [github] token_env, env: webhooks): register_secrets.
SECRET_VARS = ("ABWATCH_DATABASE_URL", "ABWATCH_API_TOKEN", "ABWATCH_ALERT_SECRET", "GITHUB_TOKEN",
               "ABWATCH_READONLY_PASSWORD")
MIN_SECRET = 4  # a shorter value would mask ordinary text all over a log
_names: set[str] = set(SECRET_VARS)
_values: set[str] = set()
_cache: tuple[tuple, list[str]] = ((), [])


def register_secrets(names: Iterable[str] = (), urls: Iterable[str] = ()) -> None:
    """Mask the values of the environment variables ``names`` and the passwords of ``urls`` (a
    ``--db`` URL) from now on, wherever :func:`mask_secrets` is applied."""
    global _cache
    _names.update(n for n in names if n)
    for url in urls:
        _values.update(_forms(url, whole=False))
    _cache = ((), [])


def _forms(value: str, whole: bool = True) -> set[str]:
    """The strings that give ``value`` away: itself (``whole``; a webhook URL is all secret) and,
    for a URL, its password; each also URL-encoded."""
    found = {value} if whole else set()
    try:
        parts = urlsplit(value)
        password = parts.password if parts.scheme and "@" in parts.netloc else None
    except ValueError:
        password = None
    if password:  # a database URL: the password is what matters, and it may be printed alone
        found |= {password, unquote(password)}
    found |= {quote(v, safe="") for v in list(found)}
    return {v for v in found if len(v) >= MIN_SECRET}


def secret_values() -> list[str]:
    """Every secret value this process knows, longest first (so a longer one is masked whole)."""
    global _cache
    key = (tuple(sorted(_names)), tuple(os.environ.get(name) for name in sorted(_names)), len(_values))
    if _cache[0] != key:
        found = set(_values)
        for name in _names:
            value = os.environ.get(name)
            if value:
                found |= _forms(value)
        _cache = (key, sorted(found, key=len, reverse=True))
    return _cache[1]


def mask_secrets(text: str, cut: bool = False) -> str:
    """``text`` with every known secret value replaced by ``***`` (as CI systems mask secrets in
    logs): build logs, workload output and error texts pass here before they are stored or shown.
    ``cut``: ``text`` is the tail of something longer, so it may start inside a secret; that
    secret's end is masked too."""
    if cut:
        for value in secret_values():
            end = next((k for k in range(len(value) - 1, MIN_SECRET - 1, -1) if text.startswith(value[-k:])), 0)
            if end:
                text = MASK + text[end:]
                break
    for value in secret_values():
        if value in text:
            text = text.replace(value, MASK)
    return text
