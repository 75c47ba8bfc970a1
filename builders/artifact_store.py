"""The artifact store build and device hosts share: content-addressed objects on a WebDAV server.

The server is an existing one (nginx's WebDAV module, ``dav_methods PUT``: docs/fleet.md says
why and how it is configured); this module is its client, through ``requests``. Every file of an
artifact is an object named by its SHA-256, ``{store}/cas/<sha256>``: pushed once (a ``HEAD``
first, skipped when the object is there), so neighbouring commits that share a library share
its object. What files make an artifact — each path with its hash, size and mode, its symbolic
links and empty directories — is its manifest (:func:`manifest_of`), which the service keeps in
the database, not here: a manifest is recorded only after all its objects were pushed.

A host that lacks an artifact fetches its objects into a staging directory of its own artifact
cache, hashing each as it arrives: an object whose bytes do not match its name is refused
(:class:`CorruptObject`) and nothing of the artifact is used. The fetched files become objects
of the local cache (as a local build's do), so an object this host holds from another entry is
linked, never downloaded again: a device host fetching the next commit downloads what changed.
The store being down, refusing the credentials or missing an object is
:class:`StoreUnavailable`: the caller builds locally.
The password comes only from the environment variable ``[artifacts] password_env`` names and
goes only into the Authorization header; it is masked wherever abwatch prints or stores text.

Anyone with the store's or the database's password can write an object or a manifest row, so a
manifest is used only when authenticated: its MAC (:meth:`ArtifactStore.sign`, HMAC-SHA256 over
the canonical JSON of the artifact key and the manifest) is made with a key only abwatch holds,
from the environment variable ``[artifacts] manifest_key_env`` names (masked like the password).
A store without that key is refused at start (:class:`NoManifestKey`). Then every entry is
checked before any of it is used (:func:`validate_manifest`): an object's name is a SHA-256, a
path is relative, canonical and without ``..`` or NUL, a size a non-negative integer, a mode
within 0o777, and a link stays inside the artifact. A manifest failing either is
:class:`InvalidManifest`: nothing of it is used, and the caller builds the commit itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import requests

from abwatch.core.redact import mask_url, register_secrets
from abwatch.core.errors import UsageError
from abwatch.builders.cache import BOOKKEEPING, OBJECTS, ArtifactCache
from abwatch.builders.objects import sha256_file
from abwatch.builders.safe_copy import link_stays_inside, venv_interpreter
from abwatch.builders.spec import ArtifactsConfig

CONNECT_TIMEOUT_S = 3.0
CHUNK = 1 << 20


class StoreUnavailable(Exception):
    """The store cannot be used right now (unreachable, refused, an object missing): build locally."""


MANIFEST_KEY_MIN = 32  # characters of the manifest key (e.g. `openssl rand -hex 32`)
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PATH = 4096


class NoManifestKey(UsageError):
    """A store is configured, but the key that authenticates its manifests is not in the environment."""


class InvalidManifest(Exception):
    """A manifest that is not used: not authenticated with this fleet's key, or an entry of it
    that is not safe to use (the message says which and why)."""


class CorruptObject(Exception):
    """An object the store returned does not match its hash: refused, never used."""

    def __init__(self, sha: str, got: str, path: str) -> None:
        super().__init__(f"object {sha[:12]} ({path}) from the store hashes to {got[:12]}: corrupt, refused")
        self.sha, self.got, self.path = sha, got, path


@dataclass(frozen=True)
class Pushed:
    """What one push did: objects sent, objects the store had already."""

    sent: int
    present: int


@dataclass(frozen=True)
class Fetched:
    """What one fetch did: the objects downloaded (and their bytes), and the files not
    downloaded (linked from the host's other entries, or repeated within the artifact)."""

    got: int
    got_bytes: int
    local: int


def manifest_of(cache: ArtifactCache, key: str) -> dict:
    """The manifest of the complete cache entry ``key``: ``files`` ({path: [sha256, size, mode]}),
    ``links`` ({path: target}) and ``dirs`` (empty directories). Packed files are rebuilt first."""
    entry = cache.materialize(key)
    listing_path = entry / OBJECTS
    known = json.loads(listing_path.read_text()) if listing_path.is_file() else {}
    files, links, dirs = {}, {}, []
    for dirpath, dirnames, filenames in os.walk(entry):
        here = Path(dirpath)
        rel_dir = here.relative_to(entry)
        if not dirnames and not filenames and here != entry:
            dirs.append(str(rel_dir))
        for name in dirnames:
            if (here / name).is_symlink():
                links[str(rel_dir / name)] = os.readlink(here / name)
        for name in filenames:
            rel = str(rel_dir / name)
            if rel in BOOKKEEPING:
                continue
            path = here / name
            if path.is_symlink():
                links[rel] = os.readlink(path)
                continue
            st = path.stat()
            files[rel] = [known.get(rel) or sha256_file(path), st.st_size, st.st_mode & 0o7777]
    return {"files": files, "links": links, "dirs": sorted(dirs)}


def canonical(artifact_key: str, manifest: dict) -> bytes:
    """What a manifest's MAC covers: the artifact key with the manifest, as canonical JSON (keys
    sorted, no spaces, ASCII), so the same manifest names the same bytes on every host and a
    manifest moved to another artifact's row no longer matches."""
    return json.dumps({"artifact_key": artifact_key, "manifest": manifest}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False).encode()


def _path(rel: object, what: str) -> str:
    if not isinstance(rel, str) or not rel:
        raise InvalidManifest(f"{what} {rel!r} is not a path")
    if "\0" in rel or len(rel) > MAX_PATH:
        raise InvalidManifest(f"{what} {rel!r} holds a NUL byte or is too long")
    if rel.startswith("/"):
        raise InvalidManifest(f"{what} {rel!r} is an absolute path")
    if ".." in rel.split("/"):
        raise InvalidManifest(f"{what} {rel!r} leaves the artifact (..)")
    if rel != str(PurePosixPath(rel)) or rel == ".":
        raise InvalidManifest(f"{what} {rel!r} is not a canonical relative path")
    if rel in BOOKKEEPING:
        raise InvalidManifest(f"{what} {rel!r} is a file of abwatch's cache")
    return rel


def validate_manifest(manifest: object) -> None:
    """Every entry of ``manifest`` checked before any is used: :class:`InvalidManifest` naming
    the first fault (see the module)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) \
            or not set(manifest) <= {"files", "links", "dirs"}:
        raise InvalidManifest("it is not a manifest (files, links, dirs)")
    files, links, dirs = manifest["files"], manifest.get("links", {}), manifest.get("dirs", [])
    if not isinstance(links, dict) or not isinstance(dirs, list):
        raise InvalidManifest("its links or dirs are not a table and a list")
    for rel, entry in files.items():
        _file_entry(_path(rel, "file"), entry)
    for rel, target in links.items():
        _link_entry(_path(rel, "link"), target)
    for rel in dirs:
        _path(rel, "directory")
    named = list(files) + list(links) + list(dirs)
    if len(set(named)) != len(named):
        raise InvalidManifest("a path is named twice (as a file, a link or a directory)")
    leaves = set(files) | set(links)
    for rel in named:
        for parent in PurePosixPath(rel).parents[:-1]:
            if str(parent) in leaves:
                raise InvalidManifest(f"{rel!r} lies under {str(parent)!r}, a file or link")


def _file_entry(rel: str, entry: object) -> None:
    if not isinstance(entry, list) or len(entry) != 3:
        raise InvalidManifest(f"file {rel!r}: {entry!r} is not [sha256, size, mode]")
    sha, size, mode = entry
    if not isinstance(sha, str) or not SHA256.fullmatch(sha):
        raise InvalidManifest(f"file {rel!r}: object {str(sha)[:80]!r} is not a SHA-256")
    if type(size) is not int or size < 0:
        raise InvalidManifest(f"file {rel!r}: size {size!r} is not a non-negative integer")
    if type(mode) is not int or not 0 <= mode <= 0o777:
        raise InvalidManifest(f"file {rel!r}: mode {mode!r} is not within 0o777 (no setuid, setgid or sticky)")


def _link_entry(rel: str, target: object) -> None:
    if not isinstance(target, str) or not target or "\0" in target or len(target) > MAX_PATH:
        raise InvalidManifest(f"link {rel!r}: target {target!r} is not a path")
    if target.startswith("/"):
        if not venv_interpreter(rel, target):  # a venv's bin/python to the interpreter: the one exception
            raise InvalidManifest(f"link {rel!r} -> {target!r} leads outside the artifact")
        return
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if lexical == ".." or lexical.startswith("../"):
        raise InvalidManifest(f"link {rel!r} -> {target!r} leads outside the artifact")


def _safe(rel: str) -> PurePosixPath:
    """A manifest path as a relative path that stays inside the entry (else ValueError)."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"manifest path {rel!r} leaves the artifact")
    return path


class ArtifactStore:
    """A client of one WebDAV store: ``has``, ``push`` and ``fetch`` of content-addressed objects."""

    def __init__(self, url: str, user: str | None = None, password_env: str | None = None,
                 timeout_s: float = 30.0, wait_s: float = 7200.0, manifest_key_env: str | None = None) -> None:
        self.url, self.user, self.password_env, self.timeout_s = url.rstrip("/"), user, password_env, timeout_s
        self.wait_s = wait_s  # how long a host waits for another host's build before it builds itself
        self.display = mask_url(self.url)  # what logs, rows and pages name
        self.manifest_key_env = manifest_key_env
        register_secrets([name for name in (password_env, manifest_key_env) if name])  # masked wherever shown
        self._http = requests.Session()

    @classmethod
    def from_config(cls, config: ArtifactsConfig, need_key: bool = True) -> ArtifactStore | None:
        """The store ``[artifacts]`` names, or None when it names none. ``need_key``: a host that
        builds or fetches needs the manifest key (:class:`NoManifestKey` without it); a report of
        what the store holds does not."""
        if not config.store:
            return None
        store = cls(config.store, config.user, config.password_env, config.timeout_s, config.wait_s,
                    config.manifest_key_env)
        if need_key:
            store.manifest_key()
        return store

    def manifest_key(self) -> bytes:
        """The key that authenticates manifests, from the environment (:class:`NoManifestKey`
        naming the variable when it is unset or too short)."""
        value = os.environ.get(self.manifest_key_env or "", "")
        if len(value) < MANIFEST_KEY_MIN:
            name = self.manifest_key_env or "(none)"
            raise NoManifestKey(
                f"[artifacts] store is set, but ${name} ([artifacts] manifest_key_env) is "
                f"{'unset' if not value else f'shorter than {MANIFEST_KEY_MIN} characters'}: it holds the key that "
                "authenticates the shared store's manifests, the same on every host of the fleet (e.g. "
                "`openssl rand -hex 32`); abwatch neither trusts nor writes manifests without it")
        return value.encode()

    def sign(self, artifact_key: str, manifest: dict) -> str:
        """The MAC of ``manifest`` as ``artifact_key``'s (hex HMAC-SHA256 of :func:`canonical`)."""
        return hmac.new(self.manifest_key(), canonical(artifact_key, manifest), hashlib.sha256).hexdigest()

    def check(self, artifact_key: str, manifest: object, mac: str | None) -> dict:
        """``manifest`` if its ``mac`` is this fleet's and every entry is safe to use, else
        :class:`InvalidManifest` saying why."""
        if not mac:
            raise InvalidManifest("it carries no MAC (not written by a host of this fleet's key)")
        try:
            expected = self.sign(artifact_key, manifest)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise InvalidManifest(f"it is not JSON abwatch writes ({exc})") from None
        if not hmac.compare_digest(expected, str(mac)):
            raise InvalidManifest("its MAC does not match (written or changed without this fleet's manifest key)")
        validate_manifest(manifest)
        return manifest  # type: ignore[return-value]

    def object_url(self, sha: str) -> str:
        """Where object ``sha`` lives in the store."""
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"not a SHA-256: {sha!r}")
        return f"{self.url}/cas/{sha}"

    def _auth(self) -> tuple[str, str] | None:
        if not self.user:
            return None
        return self.user, os.environ.get(self.password_env, "") if self.password_env else ""

    def _request(self, method: str, url: str, **kw) -> requests.Response:
        try:
            response = self._http.request(method, url, auth=self._auth(), timeout=(CONNECT_TIMEOUT_S, self.timeout_s),
                                          allow_redirects=False, **kw)
        except requests.RequestException as exc:
            raise StoreUnavailable(f"{self.display} is unreachable ({type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0][:200]})") from None
        if response.status_code in (401, 403):
            response.close()
            raise StoreUnavailable(f"{self.display} refused {method} ({response.status_code}): check user and "
                                   f"${self.password_env or '(no password_env)'}")
        if response.status_code >= 500:
            response.close()
            raise StoreUnavailable(f"{self.display} failed {method} ({response.status_code})")
        return response

    def reach(self) -> str | None:
        """None when the store answers a request now; else why not (said in the build's log)."""
        try:
            self.has("0" * 64)  # an object nobody has: 404 says the store is there and lets us in
        except StoreUnavailable as exc:
            return str(exc)
        return None

    def has(self, sha: str) -> bool:
        """Whether the store holds object ``sha`` (StoreUnavailable when it cannot say)."""
        response = self._request("HEAD", self.object_url(sha))
        response.close()
        if response.status_code == 200:
            return True
        if response.status_code == 404:
            return False
        raise StoreUnavailable(f"{self.display} answered HEAD with {response.status_code}")

    def push(self, entry: Path, manifest: dict, replace: frozenset[str] = frozenset()) -> Pushed:
        """Put every object of ``manifest`` (files under ``entry``) the store lacks; objects in
        ``replace`` (found corrupt there) are put again whatever the store says it has."""
        sent = present = 0
        done: set[str] = set()
        for rel, (sha, _size, _mode) in sorted(manifest["files"].items()):
            if sha in done:
                continue
            done.add(sha)
            if sha not in replace and self.has(sha):
                present += 1
                continue
            with open(entry / _safe(rel), "rb") as body:
                response = self._request("PUT", self.object_url(sha), data=body)
            response.close()
            if response.status_code not in (200, 201, 204):
                raise StoreUnavailable(f"{self.display} answered PUT with {response.status_code}")
            sent += 1
        return Pushed(sent, present)

    def fetch(self, cache: ArtifactCache, key: str, manifest: dict, info: dict) -> Fetched:
        """Fetch the artifact ``manifest`` describes into ``cache`` as ``key`` (call with the key's
        lock held); every object checked against its hash, the entry complete only when all are.

        :class:`CorruptObject` for an object whose bytes do not match, :class:`StoreUnavailable`
        for one the store cannot give; either way nothing is left in the cache.
        """
        validate_manifest(manifest)  # nothing of it is used before every entry is checked
        staging = cache.staging(key)
        listing, got, got_bytes = {}, 0, 0
        first: dict[tuple[str, int], Path] = {}  # (object, mode) -> where this fetch put it
        try:
            for rel, (sha, size, mode) in sorted(manifest["files"].items()):
                target = staging / _safe(rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                listing[rel] = sha
                if (sha, mode) in first:  # the same file twice in one artifact: downloaded once
                    os.link(first[sha, mode], target)
                    continue
                if cache.link_object(sha, size, mode, target):  # this host has it from another entry
                    continue
                self._get(sha, target, rel)
                if target.stat().st_size != size:  # the hash matched, so the manifest is at odds with itself
                    raise CorruptObject(sha, "size mismatch", rel)
                os.chmod(target, mode)
                got, got_bytes = got + 1, got_bytes + size
                first[sha, mode] = target
            for rel in manifest.get("dirs", []):
                (staging / _safe(rel)).mkdir(parents=True, exist_ok=True)
            for rel, link in sorted(manifest.get("links", {}).items()):
                path = staging / _safe(rel)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(link, path)
            for rel, link in manifest.get("links", {}).items():  # followed through the others: still inside
                if not venv_interpreter(rel, link) and not link_stays_inside(staging / rel, staging):
                    raise InvalidManifest(f"link {rel!r} -> {link!r} leads outside the artifact through another link")
            cache.adopt_deduplicated(key, staging, listing, info)
            return Fetched(got, got_bytes, len(listing) - got)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _get(self, sha: str, target: Path, rel: str) -> None:
        response = self._request("GET", self.object_url(sha), stream=True)
        with response:
            if response.status_code != 200:
                raise StoreUnavailable(f"{self.display} has no object {sha[:12]} ({rel}): GET answered "
                                       f"{response.status_code}")
            digest = hashlib.sha256()
            try:
                with open(target, "wb") as out:
                    for block in response.iter_content(CHUNK):
                        digest.update(block)
                        out.write(block)
            except requests.RequestException as exc:
                raise StoreUnavailable(f"{self.display}: object {sha[:12]} cut off ({type(exc).__name__})") from None
        if digest.hexdigest() != sha:
            raise CorruptObject(sha, digest.hexdigest(), rel)
