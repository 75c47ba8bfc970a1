"""Credentials never leave abwatch: URLs are masked wherever they are printed or stored."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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
