"""Which commits a pass takes up and which control each rule picks: real git repositories
(merges, dates in several time zones, a force-pushed branch), the real database (SQLite and
PostgreSQL). No benchmark runs here: each queued commit is marked tested by hand, as a job
that built and ran would mark it, so every rule is checked on many histories quickly.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone, UTC

import git
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from abwatch.service.read import queries
from abwatch.service.store import db
from abwatch.service.watch import poll as watch
from abwatch.service.cli.main import main
from abwatch.service.config import Config
from abwatch.service.store.models import Job, WatchedCommit, WatchProgress

pytestmark = pytest.mark.slow  # real builds, runs, processes or servers

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)


class History:
    """A git repository whose commits get the dates (and time zones) the test asks for."""

    def __init__(self, path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.repo = git.Repo.init(path, initial_branch="main")
        with self.repo.config_writer() as cfg:
            cfg.set_value("user", "name", "abwatch test")
            cfg.set_value("user", "email", "test@abwatch.invalid")
        self.count = 0

    def commit(self, message: str, when: datetime | None = None, parents=None) -> str:
        """One commit changing a file; ``when`` (aware) is its author and committer date."""
        self.count += 1
        name = f"{self.count}.txt"  # a file per commit: branches merge without conflicts
        (self.path / name).write_text(f"{message}\n")
        self.repo.index.add([name])
        when = when or T0 + timedelta(hours=self.count)
        # git's own "<seconds> <offset>" form: GitPython misreads RFC 2822 dates with an offset
        date = f"{int(when.timestamp())} {when.strftime('%z')}"
        made = self.repo.index.commit(message, author_date=date, commit_date=date, parent_commits=parents)
        return made.hexsha


def config_for(tmp_path, repo, **watch_keys) -> Config:
    """A watch config for ``repo`` (nothing in it is built or run by these tests)."""
    return Config.model_validate({
        "cache_dir": str(tmp_path / "cache"), "repo": {"url": str(repo)},
        "build": {"command": ["true"]}, "workloads": [{"name": "w", "command": ["true"]}],
        "runner": {"device": "box"}, "watch": watch_keys,
    })


@pytest.fixture
def engine(db_url):
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    yield engine
    engine.dispose()


def take_up(engine, config: Config, statuses: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """One pass; each queued commit (in queue order) gets its control, then the status a job
    would give it (``ok`` unless ``statuses`` says otherwise). Returns ``[(sha, control)]``."""
    statuses = statuses or {}
    picked = []
    with Session(engine, expire_on_commit=False) as session:
        report = watch.poll(session, config)
        mirror = watch.mirror_of(config)
        for device, sha in report.queued:
            row = watch._progress_row(session, config, device)
            control = watch.pick_control(session, config, mirror, row, mirror.resolve(sha))
            watched = session.scalar(select(WatchedCommit).where(WatchedCommit.progress_id == row.id)
                                     .join(WatchedCommit.commit).where(watch.Commit.sha == sha))
            watched.status = statuses.get(sha, watch.OK if control else watch.BASELINE)
            watched.control_sha = control
            picked.append((sha, control))
        session.commit()
    return picked


def test_previous_skips_broken_commits_and_step_takes_every_nth(tmp_path, engine):
    h = History(tmp_path / "repo")
    c = [h.commit(f"c{i}") for i in range(5)]
    config = config_for(tmp_path, h.path, start=c[0])
    picked = take_up(engine, config, {c[2]: watch.BUILD_FAILED})
    # c3 is compared with c1: the broken c2 is never a control
    assert picked == [(c[0], None), (c[1], c[0]), (c[2], c[1]), (c[3], c[1]), (c[4], c[3])]
    assert take_up(engine, config) == []  # nothing new, nothing queued
    c += [h.commit(f"c{i}") for i in range(5, 7)]
    assert take_up(engine, config) == [(c[5], c[4]), (c[6], c[5])]

    stepped = config_for(tmp_path, h.path, start=c[0], step=2, devices=["other"])
    assert [sha for sha, _ in take_up(engine, stepped)] == [c[0], c[2], c[4], c[6]]
    c += [h.commit(f"c{i}") for i in range(7, 10)]
    assert [sha for sha, _ in take_up(engine, stepped)] == [c[8]]  # every 2nd after c6


def test_default_start_is_the_head_and_nightly_takes_the_head_once(tmp_path, engine):
    h = History(tmp_path / "repo")
    old = [h.commit(f"old{i}") for i in range(4)]
    every = config_for(tmp_path, h.path)
    assert take_up(engine, every) == [(old[-1], None)]  # years of history are not replayed
    nightly = config_for(tmp_path, h.path, schedule="0 2 * * *", devices=["night"])
    assert take_up(engine, nightly) == [(old[-1], None)]
    new = [h.commit(f"new{i}") for i in range(3)]
    assert take_up(engine, nightly) == [(new[-1], old[-1])]  # the head, against the last tested
    assert take_up(engine, nightly) == []  # the same head is not tested twice


def test_parent_rule_and_merge_commits(tmp_path, engine):
    h = History(tmp_path / "repo")
    m0 = h.commit("m0")
    m1 = h.commit("m1")
    h.repo.git.checkout("-b", "side", m0)
    s1, s2 = h.commit("s1"), h.commit("s2")
    h.repo.git.checkout("main")
    h.repo.git.merge("--no-ff", "-m", "Merge side", "side")
    merge = h.repo.head.commit.hexsha
    m2 = h.commit("m2")
    for rule, expected in (("parent", [(m0, None), (m1, m0), (merge, m1), (m2, merge)]),
                           ("previous", [(m0, None), (m1, m0), (merge, m1), (m2, merge)])):
        config = config_for(tmp_path, h.path, start=m0, control=rule, devices=[rule])
        picked = take_up(engine, config, {m1: watch.BUILD_FAILED} if rule == "parent" else {})
        # first-parent line only: the side branch's commits are neither tested nor controls
        assert picked == expected, rule
        assert not {s1, s2} & {sha for pair in picked for sha in pair}
    # the parent rule takes the first parent even when that commit did not build
    with Session(engine) as session:
        assert session.scalar(select(WatchedCommit.control_sha).join(WatchedCommit.commit)
                              .where(watch.Commit.sha == merge).join(WatchProgress)
                              .where(WatchProgress.device == "parent")) == m1


def test_week_start_uses_utc_week_boundaries(tmp_path, engine):
    h = History(tmp_path / "repo")
    plus2, minus5 = timezone(timedelta(hours=2)), timezone(timedelta(hours=-5))
    fri = h.commit("Fri", datetime(2026, 1, 2, 12, tzinfo=UTC))  # week of Mon 29 Dec
    sat = h.commit("Sat", datetime(2026, 1, 3, 12, tzinfo=UTC))
    # Monday 01:30 in +02:00 is still Sunday 23:30 UTC: the old week
    sun = h.commit("Sun late", datetime(2026, 1, 5, 1, 30, tzinfo=plus2))
    # Sunday 19:30 in -05:00 is Monday 00:30 UTC: the new week
    mon = h.commit("Mon early", datetime(2026, 1, 4, 19, 30, tzinfo=minus5))
    tue_broken = h.commit("Tue", datetime(2026, 1, 6, 9, tzinfo=UTC))
    wed = h.commit("Wed", datetime(2026, 1, 7, 9, tzinfo=UTC))
    thu = h.commit("Thu", datetime(2026, 1, 8, 9, tzinfo=UTC))
    config = config_for(tmp_path, h.path, start=fri, control="week-start")
    picked = take_up(engine, config, {tue_broken: watch.BUILD_FAILED})
    assert picked == [
        (fri, None), (sat, fri), (sun, fri),  # the first tested commit of the week of 29 Dec
        (mon, sun),  # the first commit of a UTC week: compared with the previous one
        (tue_broken, mon), (wed, mon), (thu, mon),
    ]
    # a week whose first commit did not build: its first tested (built) commit opens it
    h2 = History(tmp_path / "repo2")
    a = h2.commit("a", datetime(2026, 2, 6, 12, tzinfo=UTC))
    b = h2.commit("b", datetime(2026, 2, 9, 8, tzinfo=UTC))  # Monday, broken
    c = h2.commit("c", datetime(2026, 2, 10, 8, tzinfo=UTC))
    d = h2.commit("d", datetime(2026, 2, 11, 8, tzinfo=UTC))
    config2 = config_for(tmp_path, h2.path, start=a, control="week-start")
    assert take_up(engine, config2, {b: watch.BUILD_FAILED}) == [(a, None), (b, a), (c, a), (d, c)]


def test_fixed_control_pins_the_base_and_a_bad_ref_is_a_config_error(tmp_path, engine, db_url, capsys):
    h = History(tmp_path / "repo")
    base = h.commit("release")
    h.repo.create_tag("v1.0")
    later = [h.commit(f"c{i}") for i in range(3)]
    config = config_for(tmp_path, h.path, start=base, control="fixed:v1.0")
    assert take_up(engine, config) == [(base, None)] + [(sha, base) for sha in later]

    toml = tmp_path / "watch.toml"
    for extra, named in (('[watch]\ncontrol = "fixed:v9.9"', "watch.control: 'v9.9'"),
                         ('[watch]\nstart = "no-such-ref"', "watch.start: unknown ref 'no-such-ref'"),
                         ('[watch]\nstart = "' + later[0] + '"\n[runner]\ndevice = "x"', None)):
        toml.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / 'cache'))}
[repo]
url = {json.dumps(str(h.path))}
branch = {'"nope"' if named is None else '"main"'}
[build]
command = ["true"]
[[workloads]]
name = "w"
command = ["true"]
{extra}
""")
        capsys.readouterr()
        assert main(["watch", "--config", str(toml), "--once", "--db", db_url]) == 2
        assert (named or "repo.branch: no branch 'nope'") in capsys.readouterr().err
    with Session(engine) as session:  # the failed passes queued nothing
        assert session.scalar(select(Job.id).where(Job.device != "box")) is None


def test_force_push_says_so_loudly_and_never_uses_the_old_line(tmp_path, engine, capsys):
    h = History(tmp_path / "repo")
    a = h.commit("a")
    b, c = h.commit("b"), h.commit("c")
    config = config_for(tmp_path, h.path, start=a)
    assert take_up(engine, config) == [(a, None), (b, a), (c, b)]
    # rewrite history after a: b and c vanish from the branch
    h.repo.git.reset("--hard", a)
    x, y = h.commit("x"), h.commit("y")
    capsys.readouterr()
    assert take_up(engine, config) == [(x, a), (y, x)]  # from the fork point; b, c never controls
    err = capsys.readouterr().err
    assert "WARNING" in err and "force-pushed" in err and c[:12] in err and f"fork point {a[:12]}" in err
    with Session(engine) as session:
        status = queries.watch_status(session)
    assert "force-pushed" in status["watched"][0]["message"]

    # a branch replaced by an unrelated history: only its head is taken up, as a new baseline
    h.repo.git.checkout("--orphan", "fresh")
    h.repo.git.rm("-rf", "--cached", ".")
    z = h.commit("unrelated root")
    h.repo.git.branch("-D", "main")
    h.repo.git.branch("-m", "main")
    h.repo.git.gc("--prune=now")
    capsys.readouterr()
    assert take_up(engine, config) == [(z, None)]  # no replay of the whole history
    assert "the new head" in capsys.readouterr().err


def test_a_pinned_base_is_a_baseline_when_it_is_the_commit_itself(tmp_path, engine):
    h = History(tmp_path / "repo")
    first = h.commit("first")
    config = config_for(tmp_path, h.path, control=f"fixed:{first}")
    assert take_up(engine, config) == [(first, None)]  # the base itself: built, not compared with itself
    second = h.commit("second")
    assert take_up(engine, config) == [(second, first)]


def test_every_control_rule_the_config_accepts_is_registered():
    """`[watch] control` names a rule of service.watch.controls.CONTROL_RULES, and nothing else."""
    import pydantic

    from abwatch.service.config import WatchConfig
    from abwatch.service.watch.controls import CONTROL_RULES

    for name in CONTROL_RULES:
        WatchConfig(control=f"{name}:v1.0" if name == "fixed" else name)  # accepted
    for bad in ("latest", "fixed", "fixed:", "previous:x"):
        with pytest.raises(pydantic.ValidationError):
            WatchConfig(control=bad)
