"""Builds shared between hosts: the artifact store (``[artifacts] store``) and the build jobs.

With a store, :func:`prepare` runs before a build and :func:`publish` after it
(:func:`service.compare.building.build_commit` calls both, so compare, verify, bisection, try
and the watch's jobs all take this path):

1. the local artifact cache has the artifact: nothing to do;
2. the store is unreachable: built here, and the build's log and the progress say so (the
   result is the same, only slower);
3. the database has the artifact's manifest: when its MAC is this fleet's and every entry is safe
   (:meth:`ArtifactStore.check`), its objects are fetched into the local cache, each checked
   against its hash; a corrupt one is refused (said), and the artifact is built here and its
   objects pushed again; a manifest that fails the check is never used: said (the commit and the
   fault), the artifact built here, and its signed manifest written over the row;
4. else (PostgreSQL) the artifact's build job (:mod:`service.store.build_jobs`): while a build
   host is alive, or one has claimed the job, this host waits for it and then fetches (step 3);
   with no build host, it claims the job itself and builds, so other hosts that need the same
   artifact wait for it instead of building it too.

A build made here is pushed (objects first, each once: ``HEAD`` then ``PUT``), then its manifest
row is committed, so a manifest never names an object the store was not given.

Code nobody merged (try and pull-request jobs: ``Builder.untrusted``) never gets here: its
builder has no store (:func:`builders.registry.make_builder`), and :func:`publish` refuses one
that would push.
"""

from __future__ import annotations

import socket
import os
import time
from dataclasses import dataclass, field

from sqlalchemy import Engine, Row, select, update
from sqlalchemy.orm import Session

from abwatch.builders import Artifact, Builder
from abwatch.builders.artifact_store import ArtifactStore, CorruptObject, InvalidManifest, StoreUnavailable, \
    manifest_of
from abwatch.service.compare.progress import Progress
from abwatch.service.store import build_jobs
from abwatch.service.store.artifacts import ArtifactManifest
from abwatch.service.store.jobs import Job, JobStatus
from abwatch.service.store.models import Build, BuildStatus, utcnow
from abwatch.service.store.rows import insert_ignoring_conflict

POLL_S = 1.0  # how often a host waiting for another host's build looks again
BUILD_HOST_SILENT_S = 180.0  # a build host silent this long (three default heartbeats) is taken as gone


@dataclass
class Plan:
    """What :func:`prepare` found for one artifact, for the build that follows and :func:`publish`."""

    key: str
    store: ArtifactStore
    fetched: bool = False  # the local cache holds it now, from the store: nothing to push
    usable: bool = True  # the store answered: what is built here is pushed
    notes: list[str] = field(default_factory=list)  # said in the log of a build made here
    corrupt: frozenset[str] = frozenset()  # objects found corrupt in the store: put again
    forged: bool = False  # the manifest row failed its check: this host's signed one replaces it
    claim: build_jobs.Claim | None = None  # the artifact's build job, claimed by this host
    failed: Build | None = None  # the build job's failed build: the commit does not build


def _engine(session: Session) -> Engine:
    bind = session.get_bind()
    return bind if isinstance(bind, Engine) else bind.engine


def prepare(session: Session, builder: Builder, sha: str, progress: Progress, *,
            claimed: bool = False) -> Plan | None:
    """Before ``builder`` builds ``sha``: get the artifact from the store, wait for another host's
    build of it, or claim its build job (see the module). None without a store. ``claimed``: this
    process runs the build job already (a build host), so it neither waits nor claims."""
    store = builder.store
    if store is None:
        return None
    if builder.untrusted:  # make_builder gives such a builder no store; never rely on one alone
        raise RuntimeError("an untrusted build was given the shared artifact store")
    key = builder.cache_key(sha)
    plan = Plan(key, store)
    if builder.cache.get(key) is not None:
        return plan
    why = store.reach()
    if why is not None:
        plan.usable = False
        return _note(plan, progress, f"artifact store: {why}: {sha[:12]} is built on this host (slower; the "
                                     "result is the same)")
    postgres = _engine(session).dialect.name == "postgresql"
    deadline, waiting = time.monotonic() + store.wait_s, False
    while True:
        stored = _from_manifest(session, builder, plan, sha, progress)
        if stored is not None:
            return stored
        if claimed or not postgres:
            return plan
        build_jobs.enqueue(session, sha, key)
        session.commit()
        job_id, state = build_jobs.status(session, key) or (0, JobStatus.QUEUED)
        if state in (JobStatus.DONE, JobStatus.FAILED):
            # the job's host commits the manifest before it ends the job: one it committed after
            # the read above is there now (each statement reads what was committed before it)
            if _manifest(session, key) is not None:
                continue
            return _ended(session, plan, sha, job_id, progress)
        if state is JobStatus.RUNNING:
            build_jobs.requeue_dead(_engine(session), job_id)  # its build host died: the job is free again
        elif not build_jobs.build_hosts_alive(session, BUILD_HOST_SILENT_S):
            plan.claim = build_jobs.claim(_engine(session), key)
            if plan.claim is not None:
                progress.message(f"  {sha[:12]}: no build host is serving: built on this host (build job {job_id})")
                return plan
        if time.monotonic() > deadline:
            return _note(plan, progress, f"waited {store.wait_s:g} s for build job {job_id} of {sha[:12]}: built on "
                                         "this host instead")
        if not waiting:
            progress.message(f"  {sha[:12]}: waiting for build job {job_id} ({state.value}) on a build host")
            waiting = True
        session.commit()  # no transaction stays open while waiting
        time.sleep(POLL_S)


def _manifest(session: Session, key: str) -> Row | None:
    """The stored manifest of ``key`` and its MAC, read fresh; None when nobody published it."""
    return session.execute(select(ArtifactManifest.manifest, ArtifactManifest.mac)
                           .where(ArtifactManifest.artifact_key == key)).first()


def _from_manifest(session: Session, builder: Builder, plan: Plan, sha: str, progress: Progress) -> Plan | None:
    """The artifact fetched by its stored manifest (or why not); None when nobody published one."""
    row = _manifest(session, plan.key)
    if row is None:
        return None
    try:
        manifest = plan.store.check(plan.key, row.manifest, row.mac)
    except InvalidManifest as exc:
        plan.forged = True
        return _note(plan, progress, f"artifact store: the manifest of {plan.key} (commit {sha[:12]}) is not used: "
                                     f"{exc}; {sha[:12]} is built on this host")
    return _fetch(session, builder, plan, sha, manifest, progress)


def _note(plan: Plan, progress: Progress, text: str) -> Plan:
    progress.message(f"  {text}")
    plan.notes.append(f"abwatch: {text}\n")
    return plan


def _ended(session: Session, plan: Plan, sha: str, job_id: int, progress: Progress) -> Plan:
    """The build job ended with no manifest: the commit did not build there (the failed build row
    is reused, nothing is built again), or its host could not push (built here)."""
    result = session.execute(select(Job.result).where(Job.id == job_id)).scalar() or {}
    if result.get("status") == BuildStatus.BUILD_FAILED.value and result.get("build_id"):
        plan.failed = session.get(Build, result["build_id"])
        if plan.failed is not None:
            return plan
    return _note(plan, progress, f"build job {job_id} of {sha[:12]} left nothing in the store: built on this host")


def _fetch(session: Session, builder: Builder, plan: Plan, sha: str, manifest: dict, progress: Progress) -> Plan:
    """Fetch the artifact into the local cache; what was wrong when it could not be used."""
    started = time.monotonic()
    with builder.cache.lock(plan.key):
        if builder.cache.get(plan.key) is not None:  # another process of this host fetched it meanwhile
            plan.fetched = True
            return plan
        builder.make_room(sha, keep={plan.key})  # [cache] limits hold for fetched artifacts as for built ones
        try:
            fetched = plan.store.fetch(builder.cache, plan.key, manifest, {"sha": sha, "builder": builder.kind,
                                                                           "fetched_from": plan.store.display})
        except CorruptObject as exc:
            plan.corrupt = frozenset({exc.sha})
            return _note(plan, progress, f"artifact store: {exc}; {sha[:12]} is built on this host and the "
                                         "object pushed again")
        except StoreUnavailable as exc:
            return _note(plan, progress, f"artifact store: {exc}: {sha[:12]} is built on this host")
        except InvalidManifest as exc:
            plan.forged = True
            return _note(plan, progress, f"artifact store: the manifest of {plan.key} (commit {sha[:12]}) is not "
                                         f"used: {exc}; {sha[:12]} is built on this host")
        # byte for byte what the build host made, but made for its interpreter and libraries
        problem = builder.runs_here(builder.cache.path(plan.key))
        if problem is not None:
            builder.cache.discard(plan.key)
            return _note(plan, progress, f"artifact store: {plan.key} cannot run on this host ({problem}): "
                                         f"{sha[:12]} is built on this host")
    plan.fetched = True
    progress.message(f"  fetched {plan.key} from {plan.store.display}: {fetched.got} object(s) "
                     f"({fetched.got_bytes / 1e6:.1f} MB), each checked against its hash, and {fetched.local} this "
                     f"host had, in {time.monotonic() - started:.1f}s")
    return plan


def noted(plan: Plan | None, artifact: Artifact) -> Artifact:
    """``artifact`` with what the store did to its build in its log (a build made here)."""
    if plan is None or not plan.notes or artifact.cached:
        return artifact
    return Artifact(key=artifact.key, path=artifact.path, cached=artifact.cached, log="".join(plan.notes) + artifact.log,
                    duration_s=artifact.duration_s, metrics=artifact.metrics, healed=artifact.healed)


def publish(session: Session, builder: Builder, plan: Plan | None, artifact: Artifact, build: Build,
            progress: Progress) -> None:
    """After a successful build: push its objects the store lacks (and those found corrupt), then
    record its manifest (committed). Nothing for an artifact fetched from the store."""
    if plan is None or plan.fetched or not plan.usable:
        return
    if builder.untrusted:
        raise RuntimeError(f"{artifact.key} is an untrusted build: it is never pushed to the shared store")
    replace = bool(plan.corrupt) or plan.forged
    have = session.execute(select(ArtifactManifest.id).where(ArtifactManifest.artifact_key == artifact.key)).first()
    if have is not None and not replace:
        return
    if not builder.portable(artifact.path):  # e.g. a tvm-source artifact built before its venv moved inside
        progress.message(f"  {artifact.key} names paths of this host: it stays on this host only")
        return
    manifest = manifest_of(builder.cache, artifact.key)
    try:
        pushed = plan.store.push(builder.cache.path(artifact.key), manifest, replace=plan.corrupt)
    except StoreUnavailable as exc:
        progress.message(f"  artifact store: {exc}: {artifact.key} stays on this host only")
        return
    values = {"manifest": manifest, "mac": plan.store.sign(artifact.key, manifest), "objects": len({f[0] for f in manifest["files"].values()}),
              "size_bytes": sum(f[1] for f in manifest["files"].values()), "store": plan.store.display,
              "host": f"{socket.gethostname()}:{os.getpid()}", "build_id": build.id, "updated_at": utcnow()}
    insert_ignoring_conflict(session, ArtifactManifest, {"artifact_key": artifact.key, "builder": builder.kind,
                                                         "sha": build.commit.sha, "created_at": utcnow(), **values},
                             ["artifact_key"])
    if replace:  # the objects of this build (and its signed manifest) replace what was there
        session.execute(update(ArtifactManifest).where(ArtifactManifest.artifact_key == artifact.key).values(**values))
    session.commit()
    progress.message(f"  pushed {artifact.key} to {plan.store.display}: {pushed.sent} object(s) sent, "
                     f"{pushed.present} there already")


def release(session: Session, plan: Plan | None, build: Build) -> None:
    """The build job this host claimed is done (the build row committed first: the hosts waiting
    for it read it)."""
    if plan is None or plan.claim is None:
        return
    session.commit()
    plan.claim.finish(JobStatus.DONE, {"sha": build.commit.sha, "status": build.status.value,
                                       "artifact_key": plan.key, "build_id": build.id})
    plan.claim = None


def give_back(plan: Plan | None, exc: BaseException) -> None:
    """A build this host claimed stopped without an outcome (interrupted, the machine's failure):
    its job goes back to the queue for another host."""
    if plan is not None and plan.claim is not None:
        plan.claim.finish(JobStatus.QUEUED, error=f"build stopped on {socket.gethostname()}:{os.getpid()}: "
                                                   f"{type(exc).__name__}: {str(exc)[:300]}")
        plan.claim = None
