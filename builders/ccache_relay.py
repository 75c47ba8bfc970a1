"""The shared compiler cache as a build sees it: read-only, through abwatch, with no password.

A build has no network (:mod:`abwatch.builders.sandbox`), and the Redis that build hosts share
as ccache's remote storage must not be written by code under test (a hostile build could store
poisoned objects for the next commit's compiles) nor even reached with its password. So while
a trusted build runs, abwatch:

* listens on a Unix socket (:class:`ReadOnlyRelay`) the build's ccache reads through
  (``redis+unix:SOCKET|read-only``): abwatch authenticates to Redis itself and passes on only
  ``GET``, ``EXISTS`` and ``PING``; anything else is answered with an error and never reaches
  Redis;
* gives ccache a second remote storage, a directory of the build's own
  (``file:OUTBOX|layout=flat``), where ccache writes each new entry under the name Redis keeps
  it by (``ccache:<name>``);
* after the build, uploads what the outbox holds to Redis itself (:func:`upload`), reading it
  without following links; a build of code nobody merged has no remote storage at all.

Only Redis is relayed; an HTTP remote storage is used where ``[sandbox] build_network`` lets
builds reach it, and otherwise not (the build says so).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

from abwatch.builders.nofollow import list_inside, read_bytes_inside

ALLOWED = frozenset({b"GET", b"EXISTS", b"PING"})  # what ccache's reads send (SELECT is answered here)
KEY_NAME = re.compile(r"^[0-9a-z]{20,64}$")  # ccache's entry names in a flat file storage
TIMEOUT_S = 30.0
MAX_BULK = 2**31


class RelayError(Exception):
    """Redis could not be reached or refused abwatch (its password), or spoke no RESP."""


def _encode(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class _Reader:
    """RESP read from a socket: a client's commands, a server's replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.file = sock.makefile("rb")

    def close(self) -> None:
        """Close the reading file (the socket is its owner's to close)."""
        self.file.close()

    def line(self) -> bytes:
        data = self.file.readline(65536)
        if not data.endswith(b"\r\n"):
            raise RelayError("connection closed or not RESP")
        return data

    def command(self) -> list[bytes] | None:
        """One command (an array of bulk strings); ``None`` at the end of the connection."""
        try:
            head = self.line()
        except RelayError:
            return None
        if not head.startswith(b"*"):
            raise RelayError("a command must be an array")
        parts = []
        for _ in range(int(head[1:])):
            size = self.line()
            if not size.startswith(b"$") or not 0 <= int(size[1:]) < MAX_BULK:
                raise RelayError("a command's parts must be bulk strings")
            parts.append(self.file.read(int(size[1:]) + 2)[:-2])
        return parts

    def reply(self) -> bytes:
        """One whole reply, as the bytes that carried it."""
        head = self.line()
        kind, rest = head[:1], head[1:-2]
        if kind in (b"+", b"-", b":"):
            return head
        if kind == b"$":
            size = int(rest)
            return head if size < 0 else head + self.file.read(size + 2)
        if kind == b"*":
            return head + b"".join(self.reply() for _ in range(max(0, int(rest))))
        raise RelayError(f"not a RESP reply: {head[:40]!r}")


def _connect(remote: str, password: str | None) -> tuple[socket.socket, _Reader]:
    """A connection to ``remote`` (``redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]``), authenticated
    (``password`` from the environment wins over one in the URL) and on its database."""
    parts = urlsplit(remote.partition("|")[0])
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=TIMEOUT_S)
    reader = _Reader(sock)
    user = unquote(parts.username) if parts.username else None
    secret = password or (unquote(parts.password) if parts.password else None)
    if user and not secret:  # ccache's form: a lone user part is the password
        user, secret = None, user
    try:
        if secret:
            sock.sendall(_encode(b"AUTH", *([user.encode()] if user else []), secret.encode()))
            if not reader.reply().startswith(b"+"):
                raise RelayError("Redis refused abwatch's password")
        database = parts.path.strip("/")
        if database:
            sock.sendall(_encode(b"SELECT", database.encode()))
            if not reader.reply().startswith(b"+"):
                raise RelayError(f"Redis has no database {database}")
    except (OSError, RelayError, ValueError):
        reader.close()
        sock.close()
        raise
    return sock, reader


class ReadOnlyRelay:
    """A Unix socket that answers a build's reads of the shared Redis, and nothing else."""

    def __init__(self, remote: str, password: str | None, owner: tuple[int, int] | None) -> None:
        self.remote, self.password = remote, password
        self._dir = tempfile.mkdtemp(prefix="abwatch-ccache-relay-")
        os.chmod(self._dir, 0o711)  # the build's user enters it, lists nothing
        self.path = os.path.join(self._dir, "redis.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        if owner is not None:  # connect(2) needs write permission on the socket: the build's user alone
            os.chown(self.path, *owner)
        os.chmod(self.path, 0o600)
        self._server.listen(64)
        self._closed = threading.Event()
        self.refused = 0  # commands a build sent that are not reads
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(client)
            try:
                upstream, replies = _connect(self.remote, self.password)
            except (OSError, RelayError, ValueError):
                return  # ccache counts a remote error and compiles
            stack.enter_context(upstream)
            stack.callback(replies.close)
            commands = _Reader(client)
            stack.callback(commands.close)
            while True:
                try:
                    command = commands.command()
                except (OSError, RelayError, ValueError):
                    return
                if not command:
                    return
                name = command[0].upper()
                if name in ALLOWED:
                    upstream.sendall(_encode(*command))
                    client.sendall(replies.reply())
                elif name in (b"SELECT", b"CLIENT"):  # the relay chose the database; names are cosmetic
                    client.sendall(b"+OK\r\n")
                elif name == b"QUIT":
                    client.sendall(b"+OK\r\n")
                    return
                else:
                    self.refused += 1
                    client.sendall(b"-ERR abwatch: the shared compiler cache is read-only for builds\r\n")

    def storage(self) -> str:
        """ccache's remote storage setting for reading through this relay."""
        return f"redis+unix:{self.path}|read-only"

    def close(self) -> None:
        """Stop listening; connections still open end with the build."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


def upload(remote: str, password: str | None, base: Path, outbox: str, limit: int = 2**30) -> tuple[int, int]:
    """Store in Redis what a trusted build's ccache wrote to ``base/outbox``: ``(entries, bytes)``.
    Entries are read without following links; names that are not ccache's are left."""
    names = [n for n in list_inside(base, outbox) if KEY_NAME.match(n)]
    if not names:
        return 0, 0
    sock, reader = _connect(remote, password)
    sent = size = 0
    with sock, contextlib.closing(reader.file):
        for name in names:
            try:
                data = read_bytes_inside(base, f"{outbox}/{name}", limit=limit)
            except OSError:  # a link or a special file: not an entry
                continue
            if data is None:
                continue
            sock.sendall(_encode(b"SET", f"ccache:{name}".encode(), data))
            if not reader.reply().startswith(b"+"):
                raise RelayError(f"Redis refused to store ccache:{name}")
            sent, size = sent + 1, size + len(data)
    return sent, size
