"""Builds as the database keeps them: one side, a pair for a run, or commits built ahead.

A build is done apart from a measurement: :func:`build_commits` builds (or finds in the
cache) commits with no run at all, so a worker can build ahead while a device is busy; a
later run of the same commits takes them from the cache and reuses their build rows.
:func:`build_pair` builds a run's two sides and holds both artifacts for its measurement.
Each build row is committed as soon as it is written: builds take minutes, and a reader (or
the next command, after a kill) sees every one that finished.
"""

from __future__ import annotations

import socket
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from abwatch.core.commit_info import CommitInfo
from abwatch.core.sides import Side
from abwatch.builders import Artifact, Builder, BuildFailed
from abwatch.service.store.models import Build, BuildStatus, Run, RunStatus, utcnow
from abwatch.service.compare import shared
from abwatch.service.compare.progress import BUILT, NullProgress, Progress, Stage, stage
from abwatch.service.store.rows import get_commits, get_repository, get_success_build

FAILURE_PREFIX = "abwatch: "  # begins a failed build log's last line: which step failed, and why


def build_failure(log: str) -> str | None:
    """What a failed build's stored log says failed (its last ``FAILURE_PREFIX`` line), if it says."""
    last = log.rstrip().rpartition("\n")[2]
    return last.removeprefix(FAILURE_PREFIX) if last.startswith(FAILURE_PREFIX) else None


@dataclass(frozen=True)
class BuildOutcome:
    """How one side's build went."""

    side: str
    ref: str
    sha: str
    status: str
    cached: bool
    build_id: int
    message: str = ""
    reused: str = ""  # the build made elsewhere whose artifact this run reused (:func:`reuse`), or ""


@dataclass(frozen=True)
class BuiltPair:
    """A run's two builds; ``paths`` holds the artifact directory of each side that built."""

    builds: list[BuildOutcome]
    paths: dict[Side, Path] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether both sides built (only then is the pair measured)."""
        return all(b.status == BuildStatus.SUCCESS.value for b in self.builds)


def build_commit(session: Session, builder: Builder, commit_id: int, info: CommitInfo,
                 progress: Progress, label: str, *, claimed: bool = False) -> tuple[Build, Artifact | None, str]:
    """Build ``info`` (or take it from the cache) and store its build row (flushed, not committed).

    With a shared artifact store (:mod:`.shared`) the artifact may come from the store or from
    another host's build instead, and one built here is pushed; ``claimed``: this process runs
    the artifact's build job (a build host). Returns the row, the artifact (None when the build
    failed) and the failure's message.
    """
    pin = builder.submodule_pin(info.sha)
    progress.message(f"building {label} ({info.sha[:12]}{f', {pin.path} at {pin.sha[:12]}' if pin else ''}) ...")
    plan = shared.prepare(session, builder, info.sha, progress, claimed=claimed)
    try:
        if plan is not None and plan.failed is not None:  # a build host found it does not build: not again here
            message = build_failure(plan.failed.log) or "the build failed on a build host"
            progress.message(f"  {label}: build FAILED (build row {plan.failed.id}): {message}")
            return plan.failed, None, message
        try:
            artifact = builder.build(info.sha)
        except BuildFailed as exc:
            # the log's last line says what failed and why: its tail, wherever shown, starts there
            build = Build(commit_id=commit_id, builder=builder.kind, config_hash=builder.config_hash(),
                          submodule_pin=pin.describe if pin else None, status=BuildStatus.BUILD_FAILED,
                          log=f"{exc.log.rstrip()}\n{FAILURE_PREFIX}{exc}\n", duration_s=exc.duration_s)
            session.add(build)
            session.flush()
            shared.release(session, plan, build)
            progress.message(f"  {label}: build FAILED: {exc}")
            return build, None, str(exc)
        artifact = shared.noted(plan, artifact)
        build = _success_row(session, commit_id, info.sha, builder, artifact)
        if not artifact.cached:  # whole in the cache now (a cached one is measured once held: build_pair)
            measure_size(build, builder, artifact.path)
        shared.publish(session, builder, plan, artifact, build, progress)
        shared.release(session, plan, build)
    except BaseException as exc:
        shared.give_back(plan, exc)
        raise
    if artifact.healed:
        progress.message(f"  {label}: WARNING: cached build {artifact.key} was damaged ({artifact.healed}); "
                         f"built again in {artifact.duration_s:.1f}s")
    else:
        reused = reuse(build, place(builder))
        progress.message(f"  {label}: {reused} ({artifact.key})" if reused
                         else f"  {label}: reused cached build {artifact.key}" if artifact.cached
                         else f"  {label}: built in {artifact.duration_s:.1f}s")
    return build, artifact, ""


def build_commits(session: Session, builder: Builder, refs: list[str],
                  progress: Progress | None = None, *, claimed: bool = False) -> list[BuildOutcome]:
    """Build each of ``refs`` apart from any run (a build worker's job); a row for each, committed.

    Refs are resolved first, so an unknown ref fails before anything is built. The
    artifacts stay in the cache; a later run of these commits reuses them and their rows.
    """
    progress = progress or NullProgress()
    infos = [(ref, builder.resolve(ref)) for ref in refs]
    repository = get_repository(session, builder.repository_url)
    commits = get_commits(session, repository, [info for _, info in infos])
    session.commit()
    outcomes = []
    for ref, info in infos:
        build, artifact, message = build_commit(session, builder, commits[info.sha].id, info, progress, ref,
                                                claimed=claimed)
        session.commit()
        outcomes.append(BuildOutcome("", ref, info.sha, build.status.value,
                                     artifact is not None and artifact.cached, build.id, message,
                                     reuse(build, place(builder))))
    return outcomes


def build_pair(session: Session, builder: Builder, run: Run, sides: dict[Side, tuple[str, CommitInfo]],
               held: ExitStack, progress: Progress | None = None) -> BuiltPair:
    """Build (or take from the cache) both sides of ``run``, each held in ``held`` until it closes.

    Each side's build row is stored on the run and committed as it is done. If a side
    fails, the run is finished as ``build_failed`` (the pair is never compared).
    """
    progress = progress or NullProgress()
    outcomes, paths = [], {}
    for side, (ref, info) in sides.items():
        commit_id = run.control_commit_id if side is Side.CONTROL else run.treatment_commit_id
        build, artifact, message = build_commit(session, builder, commit_id, info, progress, f"{side.value} {ref}")
        if artifact is not None:
            # held, the other side's build cannot pack or evict this one while it is measured
            paths[side] = held.enter_context(builder.cache.hold(artifact.key))
            measure_size(build, builder, paths[side])  # a build stored before sizes were kept
        outcome = BuildOutcome(side.value, ref, info.sha, build.status.value,
                               artifact is not None and artifact.cached, build.id, message,
                               reuse(build, place(builder)))
        outcomes.append(outcome)
        setattr(run, f"{side.value}_build_id", build.id)
        session.commit()
        stage(progress, Stage(BUILT, _how(outcome, artifact), side=side.value, sha=info.sha))
    pair = BuiltPair(outcomes, paths)
    if not pair.ok:
        run.status = RunStatus.BUILD_FAILED
        run.error = "; ".join(b.message for b in outcomes if b.message)
        run.finished_at = utcnow()
        session.commit()
    return pair


def _how(outcome: BuildOutcome, artifact: Artifact | None) -> str:
    """How a side's build went, in a few words: ``built in N s``, ``cached``, the reuse, or the failure."""
    if artifact is None:
        return f"build FAILED: {outcome.message.splitlines()[0] if outcome.message.strip() else outcome.status}"
    if outcome.reused:
        return outcome.reused
    return "cached" if artifact.cached else f"built in {artifact.duration_s:.0f} s"


def measure_size(build: Build, builder: Builder, path: Path) -> None:
    """Keep the sizes of the build's libraries (``binary_size``: the files its builder names)
    on its row, once: the files of one artifact do not change."""
    metrics = build.metrics or {}
    if "binary_size" in metrics:
        return
    sizes = builder.binary_size(path)
    if sizes is not None:
        build.metrics = {**metrics, "binary_size": sizes}  # a new dict, so the JSON column sees the change


def place(builder: Builder) -> str:
    """Where ``builder`` builds: this host and its artifact cache's directory (``host:cache_dir``)."""
    return f"{socket.gethostname()}:{builder.cache.root}"[:400]


def run_place(run: Run) -> str | None:
    """Where ``run`` built (:func:`place`), from the host and the config stored with it."""
    cache_dir = (run.config or {}).get("cache_dir")
    return f"{run.host}:{Path(cache_dir) / 'artifacts'}"[:400] if run.host and cache_dir else None


def _success_row(session: Session, commit_id: int, sha: str, builder: Builder, artifact: Artifact) -> Build:
    """The build row of a successful artifact in this place: the original one when it came from
    this place's cache, a row of its own when built here after another place built it too, the
    reused build's when another place's artifact was fetched (:func:`reuse` names it)."""
    pin = builder.submodule_pin(sha)
    return get_success_build(session, commit_id, builder.kind, builder.config_hash(), artifact,
                             pin.describe if pin else None, place(builder))


def reuse(build: Build, here: str | None) -> str:
    """What a run in place ``here`` says of a build row made elsewhere: ``reused build #N built
    on <host> in <cache_dir>``; "" for one made here (or stored before places were kept)."""
    if here is None or build.place is None or build.place == here or build.status != BuildStatus.SUCCESS:
        return ""
    host, _, cache_dir = build.place.partition(":")
    return f"reused build #{build.id} built on {host} in {cache_dir}"
