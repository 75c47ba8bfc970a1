"""ccache for the tvm-source builder: a local cache per ``cache_dir``, optionally in front of a
remote storage that build hosts share (ccache's Redis or HTTP backend), and each build's hits.

With ``[build] ccache_remote`` set, every compile looks in the local cache first, then in the
remote storage (``CCACHE_NOREMOTE_ONLY``), and a miss in both is compiled once and written to
both: a header change compiled on one build host is a remote hit on every other. The password
(or HTTP bearer token) is read from the environment variable ``ccache_remote_password_env``
names and put only into the build's own environment; abwatch masks it wherever it prints or
stores text (:func:`abwatch.core.redact.register_secrets`), and the URL it shows and stores
never holds it.

Unreachable storage never fails a build or changes its output. Before each build a TCP
connect (``CONNECT_TIMEOUT_S``) decides whether the remote storage is used at all: when it
fails, the build runs on the local cache alone and its log says so. The connect cannot see
what fails later (a wrong password, a server lost mid-build): for that ccache's own counters
are read after the build (``remote_storage_error``, ``remote_storage_timeout``; ccache counts
such a failure as a miss and compiles), and the log says how many compiles ran without it.

A build never reaches the remote storage itself: it has no network and never sees the
password. For Redis, abwatch relays its reads (``builders.ccache_relay``: ``GET`` only, through a
Unix socket) and uploads what its compiles added once it is done; an HTTP remote storage is
used only where ``[sandbox] build_network`` gives builds the network.

Each build's counts come from its own ccache stats log (``CCACHE_STATSLOG``, read with
``ccache --print-log-stats``), so concurrent builds sharing one ``CCACHE_DIR`` never mix their
counts and the cache's lifetime counters (``ccache --print-stats``, what ``abwatch cache``
shows) are never zeroed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from abwatch.core.redact import mask_url, register_secrets
from abwatch.builders.ccache_relay import ReadOnlyRelay, RelayError, upload
from abwatch.builders.sandbox import policy
from abwatch.builders.spec import REMOTE_STORAGE_PORTS

CONNECT_TIMEOUT_S = 2.0
STATS_LOG = "ccache-stats.log"
# characters a password may hold and still stand alone in a Redis URL's user part (ccache
# splits that part at ':' after decoding it, so any other password goes as USER:PASSWORD)
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


@dataclass(frozen=True)
class CcacheStats:
    """One build's compiles as ccache counted them."""

    local_hits: int
    remote_hits: int
    misses: int
    remote_errors: int  # failed or timed-out requests to the remote storage (each compile then went on without it)

    @property
    def hits(self) -> int:
        """Compiles answered by either cache."""
        return self.local_hits + self.remote_hits

    @property
    def hit_rate(self) -> float | None:
        """Hits among the compiles ccache could cache; None when there were none."""
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else None

    def metrics(self) -> dict:
        """The build row's ``ccache_*`` metrics."""
        return {"ccache_hits": self.hits, "ccache_misses": self.misses, "ccache_hit_rate": self.hit_rate,
                "ccache_local_hits": self.local_hits, "ccache_remote_hits": self.remote_hits}

    def describe(self) -> str:
        """``3 local + 40 remote hits, 2 misses (96 %)``."""
        rate = f" ({self.hit_rate:.0%})" if self.hit_rate is not None else ""
        return f"{self.local_hits} local + {self.remote_hits} remote hits, {self.misses} misses{rate}"


def parse_stats(text: str) -> CcacheStats:
    """The counts of ``ccache --print-stats`` or ``--print-log-stats`` (tab-separated)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            values[name.strip()] = int(value)
    hits = values.get("direct_cache_hit", 0) + values.get("preprocessed_cache_hit", 0)
    # a hit is a remote one when the local storage missed it; ccache counts each result once
    remote = min(values.get("remote_storage_hit", 0), hits)
    return CcacheStats(local_hits=hits - remote, remote_hits=remote, misses=values.get("cache_miss", 0),
                       remote_errors=values.get("remote_storage_error", 0) + values.get("remote_storage_timeout", 0))


def with_password(remote: str, password: str | None) -> str:
    """ccache's remote storage setting for ``remote`` (a checked ``ccache_remote``) with ``password``.

    Redis: ``redis://PASSWORD@host`` or ``redis://USER:PASSWORD@host`` (``default``, Redis's own
    user, when the URL names none and the password needs percent-encoding: ccache reads a lone
    user part as the password only before it is decoded). HTTP: basic auth for the URL's user,
    else the ``bearer-token`` attribute.
    """
    if not password:
        return remote
    url, bar, attributes = remote.partition("|")
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user = parts.username
    if parts.scheme == "http" and not user:
        return remote + f"|bearer-token={quote(password, safe='')}"
    if parts.scheme == "redis" and not user:
        user = None if set(password) <= _PLAIN else "default"
    userinfo = f"{user}:{quote(password, safe='')}" if user else password
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}")) + bar + attributes


def reach(remote: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to ``remote``'s host and port opens within ``timeout_s``; else why not."""
    parts = urlsplit(remote.partition("|")[0])
    address = (parts.hostname or "", parts.port or REMOTE_STORAGE_PORTS[parts.scheme])
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer from {address[0]}:{address[1]} within {timeout_s:g} s"
    except OSError as exc:
        return f"{address[0]}:{address[1]}: {exc.strerror or exc}"


class CompilerCache:
    """The ccache settings of one builder: its local directory, its remote storage, and the
    decision, made once per build (:meth:`begin`), whether that storage is used."""

    def __init__(self, local_dir: Path, basedir: Path, remote: str | None = None,
                 password_env: str | None = None) -> None:
        self.local_dir, self.basedir = local_dir, basedir
        self.remote, self.password_env = remote, password_env
        self.display = mask_url(remote) if remote else None  # what logs, rows and pages name
        if password_env:
            register_secrets([password_env])  # masked in whatever this process prints or stores
        self.use_remote = False
        self.unreachable: str | None = None
        self.relay: ReadOnlyRelay | None = None
        self.outbox: Path | None = None

    def begin(self, log: list[str]) -> None:
        """Before a build: is the remote storage there? The answer goes into ``log``."""
        self.use_remote, self.unreachable = False, None
        if not self.remote:
            return
        if not self.remote.startswith("redis:") and not policy().build_network:
            log.append(f"ccache: remote storage {self.display} is not used: builds have no network "
                       "([sandbox] build_network), and only a Redis storage is relayed to them\n")
            return
        if self.password_env and not os.environ.get(self.password_env):
            log.append(f"note: ${self.password_env} (ccache_remote_password_env) is not set: the remote "
                       "compiler cache is asked without a password\n")
        self.unreachable = reach(self.remote)
        self.use_remote = self.unreachable is None
        if self.use_remote and self.remote.startswith("redis:"):
            rules = policy()
            owner = (rules.uid, rules.gid) if rules.enabled and rules.uid is not None and rules.gid is not None else None
            self.relay = ReadOnlyRelay(self.remote, self._password(), owner)
            self.outbox = self.local_dir / f"outbox-{uuid.uuid4().hex[:12]}"
            self.outbox.mkdir(parents=True)
        if self.use_remote:
            log.append(f"ccache: remote storage {self.display}, behind the local cache {self.local_dir}"
                       f"{' (read through abwatch; what the build adds is uploaded after it)' if self.relay else ''}\n")
        else:
            log.append(f"ccache: remote storage {self.display} is unreachable ({self.unreachable}): this build "
                       "uses the local cache only (slower where another build host compiled the same sources; "
                       "the output is the same)\n")

    def env(self, stats_log: Path | None = None) -> dict[str, str]:
        """ccache's variables for a build step (the caller adds them to the child's environment).

        ``CCACHE_REMOTE_STORAGE`` is always set, to nothing when the remote storage is not used,
        so a setting inherited from elsewhere cannot reach a storage abwatch decided against.
        """
        # CCACHE_NOREMOTE_ONLY: the local cache stays in front (ccache reads CCACHE_REMOTE_ONLY=false as an error)
        env = {"CCACHE_BASEDIR": str(self.basedir), "CCACHE_DIR": str(self.local_dir), "CCACHE_NOHASHDIR": "1",
               "CCACHE_NOREMOTE_ONLY": "1", "CCACHE_REMOTE_STORAGE": ""}
        if self.relay is not None and self.outbox is not None:
            env["CCACHE_REMOTE_STORAGE"] = f"{self.relay.storage()} file:{self.outbox}|layout=flat"
        elif self.use_remote and self.remote:
            env["CCACHE_REMOTE_STORAGE"] = with_password(self.remote, self._password())
        if stats_log is not None:
            env["CCACHE_STATSLOG"] = str(stats_log)
        return env

    def _password(self) -> str | None:
        return os.environ.get(self.password_env) if self.password_env else None

    def finish(self, log: list[str]) -> dict:
        """After a build's compiles: stop relaying, and upload what they added to the remote
        storage (abwatch's write, never the build's); the counts for the build row."""
        relay, outbox = self.relay, self.outbox
        self.relay, self.outbox, self.use_remote = None, None, False
        if relay is None or outbox is None:
            return {}
        relay.close()
        try:
            entries, size = upload(relay.remote, relay.password, self.local_dir.parent,
                                   f"{self.local_dir.name}/{outbox.name}")
            log.append(f"ccache: uploaded {entries} new entr{'y' if entries == 1 else 'ies'} "
                       f"({size / 1e6:.1f} MB) to {self.display}\n")
        except (OSError, RelayError, ValueError) as exc:
            entries = 0
            log.append(f"ccache: could not upload this build's entries to {self.display} ({exc}): "
                       "other build hosts compile them again\n")
        finally:
            shutil.rmtree(outbox, ignore_errors=True)
        if relay.refused:
            log.append(f"ccache: the build sent {relay.refused} command(s) that are not reads to the shared "
                       "compiler cache; refused\n")
        return {"ccache_uploaded": entries}

    def metrics(self, stats: CcacheStats, log: list[str]) -> dict:
        """After a build: its ``ccache_*`` metrics, with what happened to the remote storage (also in ``log``)."""
        metrics = stats.metrics()
        log.append(f"ccache: {stats.describe()}\n")
        if not self.remote:
            return metrics
        state = "unreachable" if not self.use_remote else "failed" if stats.remote_errors else "used"
        if state == "failed":
            log.append(f"ccache: the remote storage {self.display} failed {stats.remote_errors} request(s) during "
                       "the build (refused, a wrong password, or lost): those compiles used the local cache only\n")
        return {**metrics, "ccache_remote": self.display, "ccache_remote_state": state,
                "ccache_remote_errors": stats.remote_errors}


def lifetime_stats(ccache: str, local_dir: Path) -> CcacheStats | None:
    """The counts of every compile ``local_dir`` has served since its counters were last zeroed;
    None where ccache cannot say (no such directory yet, or ccache failed)."""
    if not local_dir.is_dir():
        return None
    try:
        out = subprocess.run([ccache, "--print-stats"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CCACHE_DIR": str(local_dir)})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_stats(out.stdout) if out.returncode == 0 else None
