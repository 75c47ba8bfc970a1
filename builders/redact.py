"""Credentials never leave abwatch: URLs are masked wherever they are printed or stored."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with its password (or a lone token in the user part) replaced by ``***``.

    ``https://user:token@host/x`` → ``https://user:***@host/x``;
    ``https://token@host/x`` → ``https://***@host/x``; paths and scp-style
    ``git@host:repo`` (no secret in them) are returned unchanged.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
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
