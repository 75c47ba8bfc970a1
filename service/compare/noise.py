"""Noise awareness: learn each (workload, device)'s process-to-process noise from its `same`
verdicts, and start the next run with as many invocations as that noise needs, each taking
the samples that reach an interval fastest, and each fork server serving the children that do
(a TVM workload's; service/stats/repetitions.py), learnt from every trusted run: a workload
whose runs end `unknown` on a busy host is the one that most needs cheaper processes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, case, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from abwatch.runners.fork_servers import prestarts
from abwatch.service import stats
from abwatch.service.config import Config
from abwatch.service.store.models import Invocation, InvocationStatus, NoiseProfile, utcnow

MIN_START = 4  # fewer processes than this cannot give a useful first look
MAX_START_FACTOR = 3  # a very noisy history starts at most this many times run.repetitions
MEMORY = 20  # observations a profile averages over before it starts to follow drift
# Every RECHECK-th learnt run takes the workload's own samples again: only a process with more
# samples than a count can show what that count costs, so this is how a choice is re-learnt
# when the host or the workload changes.
RECHECK = 10
MIN_CHILD_S = 0.001  # a forked child's least cost (seconds): its fork, load and reply are never free
MAX_PAIRS_AHEAD = 500  # the most pairs a children choice looks ahead to (a run's budget rarely buys more)


def starting_repetitions(session: Session, config: Config, workload_id: int, device_id: int | None,
                         floor: int | None = None) -> tuple[int, str]:
    """Invocations per side for the first look, and why that many."""
    default = config.run.repetitions
    profile = None
    if config.run.noise_aware and device_id is not None:
        profile = _profile(session, workload_id, device_id)
    if profile is None or profile.process_cv is None:  # none, or counts learnt from runs never `same`
        return default, f"{default} invocations a side (configured; no noise history)"
    # the interval decides a regression, so plan at its level; the sequence may look any
    # number of times, so a small start costs nothing but looks
    planned = stats.planned_repetitions(profile.process_cv, config.stats.target_pct,
                                        1.0 - config.stats.confidence, config.stats.power)
    most = config.run.max_repetitions or MAX_START_FACTOR * config.run.repetitions
    start = min(most, max(planned, MIN_START, floor or 0))
    return start, (f"{start} invocations a side (process noise {profile.process_cv:.2%} from "
                   f"{profile.observations} past run(s) needs {planned} for {config.stats.target_pct:g}%)")


def _profile(session: Session, workload_id: int, device_id: int) -> NoiseProfile | None:
    # read afresh: learn() writes with one UPDATE statement, past the session's copies
    return session.scalar(select(NoiseProfile).where(
        NoiseProfile.workload_id == workload_id, NoiseProfile.device_id == device_id)
        .execution_options(populate_existing=True))


def samples_per_process(session: Session, config: Config, workload: Any, workload_id: int,
                        device_id: int | None) -> tuple[int | None, str]:
    """The samples a process this run takes where the noise history chose a count for the
    workload (None: its own), and why. Only a TVM workload's ``samples`` are chosen, and only
    where its config does not set them."""
    own = getattr(workload, "samples", None)
    if own is None or "samples" in workload.model_fields_set or not config.run.noise_aware or device_id is None:
        return None, ""
    profile = _profile(session, workload_id, device_id)
    if profile is None or profile.samples is None or profile.samples == own:
        return None, ""
    if profile.lessons % RECHECK == 0:
        return None, (f"{own} samples a process (its own: every {RECHECK}th learnt run re-learns the count; "
                      f"last learnt {profile.samples})")
    return profile.samples, f"{profile.samples_reason}, learnt from {profile.lessons} past run(s)"


def children_per_server(session: Session, config: Config, workload: Any, workload_id: int,
                        device_id: int | None) -> tuple[int | None, str]:
    """The children a fork server this run's forked processes of the workload take where its
    noise history chose a count (None: the runner's), and why. Only where the runner forks
    timed workers and the workload does not set its own ``children_per_server``."""
    if (getattr(workload, "children_per_server", 0) is not None or config.runner.processes != "forked"
            or not config.run.noise_aware or device_id is None):
        return None, ""
    profile = _profile(session, workload_id, device_id)
    # a count is learnt below the runner's (never above it): a runner since set lower wins
    if profile is None or profile.children is None or profile.children >= config.runner.children_per_server:
        return None, ""
    return profile.children, f"{profile.children_reason}, learnt from {profile.lessons} past run(s)"


@dataclass(frozen=True)
class ServerCosts:
    """What a run's fork servers cost: a server's start and a child (seconds, medians), and
    whether its servers were started ahead of need (``ahead``: ``[runner] servers_ahead`` where
    this host's runners start a server's successor when it takes its first child,
    runners.fork_servers.prestarts)."""

    start_s: float
    child_s: float
    ahead: bool


def server_costs(session: Session, run_id: int, workload_id: int, ahead: bool = True) -> ServerCosts | None:
    """What starting a fork server cost and what one forked child did, from the run's forked
    invocations (None: no child after a first, or no server started in the run). A server's
    start is what its first child recorded of it (``server_start_s``: a server left live by
    an earlier workload or run had its first child there); a child, a server's later children's
    wall time (a server's first child also holds its wait for the server)."""
    rows = session.execute(select(Invocation.side, Invocation.server, Invocation.wall_s, Invocation.server_start_s)
                           .where(Invocation.run_id == run_id, Invocation.workload_id == workload_id,
                                  Invocation.warmup.is_(False), Invocation.status == InvocationStatus.OK,
                                  Invocation.server.is_not(None))
                           .order_by(Invocation.position)).all()
    served: dict[tuple, list[float]] = {}
    starts: list[float] = []
    for side, server, wall, start in rows:
        served.setdefault((side, server), []).append(wall)
        if start is not None:
            starts.append(start)
    later = [wall for walls in served.values() for wall in walls[1:]]
    if not later or not starts:
        return None
    return ServerCosts(statistics.median(starts), statistics.median(later), prestarts(ahead))


def child_at(child_s: float, samples: stats.SamplesChoice | None) -> float:
    """What a forked child costs (seconds) once it takes the samples a process just chosen:
    ``child_s``, measured at the run's own count, moved by what the choice's own table says the
    two counts' processes differ by. A child's cost is what a server's start is weighed against
    (:func:`stats.choose_children`), and a child of 5 samples may cost a sixth of one of 100: the
    server's start is then hidden behind far fewer seconds of children."""
    if samples is None or samples.samples == samples.configured:
        return child_s
    seconds = {option.samples: option.seconds for option in samples.options}
    return max(MIN_CHILD_S, child_s + seconds[samples.samples] - seconds[samples.configured])


def pairs_ahead(pairs: int, measured_child_s: float, child_s: float) -> int:
    """The pairs a children choice is weighed at: the ``pairs`` a run made with children of
    ``measured_child_s``, in the same time, once its children cost ``child_s`` (those of the
    samples learnt with them, :func:`child_at`), at most :data:`MAX_PAIRS_AHEAD`. A teaching run
    of 100 samples a process (builtin:mlp beside six busy loops: 12 pairs in 300 s) would
    otherwise choose for a horizon where only two children a server make three server pairs,
    and the next run, of cheap children, would pay a fork server's start every two of them."""
    return max(pairs, min(MAX_PAIRS_AHEAD, round(pairs * measured_child_s / child_s)))


def choose_children(session: Session, run_id: int, workload_id: int, samples: Mapping[str, Sequence[float]],
                    groups: Mapping[str, Sequence[int]], servers: Mapping[str, Sequence[Hashable]],
                    configured: int, ahead: bool = True, chosen: stats.SamplesChoice | None = None,
                    typical: Callable[[Sequence[float]], float] = min,
                    earlier: tuple[float, int] | None = None) -> stats.ChildrenChoice | None:
    """The children a fork server to learn from a forked run (``servers``: each sample's fork
    server by side, :func:`contended.server_labels`' ``<side>_servers``; ``ahead``: whether the
    runner may start servers ahead, :func:`server_costs`; ``chosen``: the samples a process
    learnt from the same run, which the children will take, :func:`child_at`; None where the
    run was not forked or too few servers served two children; ``typical``: what the verdict
    judged a process by, of its samples; ``earlier``: the servers' share its history holds and
    of how many runs, pooled with this run's, :func:`earlier_share`)."""
    taken: dict[tuple[str, int], list[float]] = {}
    server_of: dict[tuple[str, int], Hashable] = {}
    for side in samples:
        labels = servers.get(f"{side}_servers") or []
        for value, group, label in zip(samples[side], groups[side], labels, strict=False):
            if label is not None:
                taken.setdefault((side, group), []).append(value)
                server_of[(side, group)] = (side, label)
    fastest = {key: typical(values) for key, values in taken.items()}
    costs = server_costs(session, run_id, workload_id, ahead)
    if not fastest or costs is None:
        return None
    keys = list(fastest)
    pairs = min(sum(1 for side, _ in keys if side == name) for name in samples)
    child_s = child_at(costs.child_s, chosen)
    pairs = pairs_ahead(pairs, costs.child_s, child_s)
    try:
        choice = stats.choose_children([fastest[k] for k in keys], [server_of[k] for k in keys],
                                       [k[0] for k in keys], server_s=costs.start_s,
                                       child_s=child_s, configured=configured, pairs=pairs,
                                       ahead=costs.ahead, earlier=earlier)
    except ValueError:  # too few servers of two children, too few pairs, no time a child
        return None
    if chosen is not None and chosen.samples != chosen.configured:
        return replace(choice, reason=f"{choice.reason[:-1]}, a child costed at its {chosen.samples} samples)")
    return choice


def earlier_share(session: Session, workload_id: int, device_id: int) -> tuple[float, int] | None:
    """The servers' share of a forked workload's variance its earlier runs taught (their mean,
    each weighed alike up to :data:`MEMORY` runs, so it follows drift) and how many runs that
    mean weighs as (None: none taught one)."""
    profile = _profile(session, workload_id, device_id)
    if profile is None or profile.server_share is None:
        return None
    return profile.server_share, min(profile.server_share_runs, MEMORY)


def process_costs(session: Session, run_id: int, workload_id: int, samples_each: int) -> tuple[float, float] | None:
    """What a measured process of the run cost besides its samples, and one sample, in seconds
    (medians over its timed invocations; None: none has a timing batch)."""
    timed = session.execute(select(Invocation.wall_s, Invocation.usage_wall_s).where(
        Invocation.run_id == run_id, Invocation.workload_id == workload_id, Invocation.warmup.is_(False),
        Invocation.status == InvocationStatus.OK, Invocation.usage_wall_s.is_not(None))).all()
    if not timed:
        return None
    # a process's fixed part: its whole life less its timing batch; a sample: the batch's share
    return (statistics.median(max(0.0, wall - (batch or 0.0)) for wall, batch in timed),
            statistics.median((batch or 0.0) / samples_each for _, batch in timed))


def choose_samples(session: Session, run_id: int, workload_id: int, samples: Mapping[str, Sequence[float]],
                   groups: Mapping[str, Sequence[int]], own: int,
                   typical: Callable[[Sequence[float]], float] = min) -> stats.SamplesChoice | None:
    """The samples a process to learn from a run whose processes took ``own`` samples each
    (None: not learnable from it: another count, too few processes, no timing figures);
    ``typical``: what its verdict judged a process by, of its samples."""
    processes: dict[tuple[str, int], list[float]] = {}
    for side in samples:
        for value, group in zip(samples[side], groups[side], strict=True):
            processes.setdefault((side, group), []).append(value)
    if not processes or any(len(p) != own for p in processes.values()):
        return None
    costs = process_costs(session, run_id, workload_id, own)
    if costs is None:
        return None
    try:
        return stats.choose_samples(list(processes.values()), fixed_s=costs[0], sample_s=costs[1], configured=own,
                                    typical=typical, sides=[side for side, _ in processes])
    except ValueError:  # too few processes, or no time a sample
        return None


def learn(session: Session, workload_id: int, device_id: int | None, samples: dict, groups: dict,
          run_id: int | None = None, configured_samples: int | None = None,
          servers: Mapping[str, Sequence[Hashable]] | None = None, configured_children: int | None = None,
          servers_ahead: bool = True, typical: Callable[[Sequence[float]], float] = min,
          same: bool = True) -> None:
    """Fold a trusted run's lesson into the profile: where its verdict was ``same`` (an A/A-like
    comparison), its noise; whatever its verdict, for a TVM workload (``configured_samples``:
    its own samples a process) whose run ``run_id`` took them, the samples a process that run
    shows to be fastest (:func:`choose_samples`), and where its processes were forked
    (``servers``, each sample's), the children a fork server against ``configured_children``,
    the runner's (:func:`choose_children`; ``servers_ahead``: the runner's, whether it starts
    servers ahead). ``typical``: what the verdict judged a process by, of its samples (its
    fastest; the faster half of its samples' CPU times under contention)."""
    if device_id is None:
        return
    cv = None
    if same:
        try:
            cv = sum(stats.process_cv(samples[side], groups[side]) for side in samples) / len(samples)
        except ValueError:
            cv = None
    choice = (None if run_id is None or configured_samples is None
              else choose_samples(session, run_id, workload_id, samples, groups, configured_samples, typical))
    chosen = {} if choice is None else {"samples": choice.samples, "samples_reason": choice.reason}
    children = (None if run_id is None or not servers or configured_children is None
                else choose_children(session, run_id, workload_id, samples, groups, servers, configured_children,
                                     servers_ahead, choice, typical, earlier_share(session, workload_id, device_id)))
    share = None
    if children is not None:
        chosen.update(children=children.children, children_reason=children.reason)
        share = children.run_rho
    if cv is None and not chosen and configured_samples is None and not servers:
        return  # nothing to learn: no noise, and no counts of a TVM workload
    _fold(session, workload_id, device_id, cv, chosen, share)


def _fold(session: Session, workload_id: int, device_id: int, cv: float | None, chosen: dict,
          share: float | None = None) -> None:
    """Fold one run into the (workload, device)'s profile in one statement that reads and
    writes the row, so two runs that finish at once both count (a read-then-write in Python
    would lose one of them): its noise ``cv`` where it was a `same` run (None: not), the counts
    it ``chosen``, its fork servers' ``share`` of its variance where a children choice measured
    it, and one lesson."""
    table = cast(Table, NoiseProfile.__table__)
    dialect = session.get_bind().dialect.name
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table).values(
        workload_id=workload_id, device_id=device_id, process_cv=cv, observations=int(cv is not None), lessons=1,
        updated_at=utcnow(), server_share=share, server_share_runs=int(share is not None), **chosen)

    def running_mean(value: str, count: str) -> dict[str, Any]:
        # the row's mean over its ``count`` runs (at most MEMORY weighed: then it follows drift)
        # and this run's; none before (a profile of counts alone): weight 0 takes this run's
        weight = case((table.c[count] < MEMORY, table.c[count]), else_=MEMORY)
        return {value: (func.coalesce(table.c[value], 0.0) * weight + statement.excluded[value]) / (weight + 1),
                count: table.c[count] + 1}

    noise: dict[str, Any] = {}
    if cv is not None:
        noise |= running_mean("process_cv", "observations")
    if share is not None:
        noise |= running_mean("server_share", "server_share_runs")
    session.execute(statement.on_conflict_do_update(
        index_elements=["workload_id", "device_id"],
        set_={**noise,
              "lessons": table.c.lessons + 1,
              "updated_at": statement.excluded.updated_at,
              **{name: getattr(statement.excluded, name) for name in chosen}}))
    session.flush()
