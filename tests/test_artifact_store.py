"""The shared artifact store against a real nginx WebDAV server: a build on one host is fetched
by another (whose build command never runs), a corrupt object is refused and rebuilt, a store
that is down leaves every host building for itself, and the password stays a secret.

Each "host" is a config with a cache_dir of its own on one PostgreSQL database; the build
command appends to a file outside the sandboxed checkout, so each run of it is counted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from abwatch.builders import make_builder, sandbox
from abwatch.builders.spec import SandboxConfig
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.compare.building import build_commits
from abwatch.service.config import load_config
from abwatch.service.read.queries import build_detail
from abwatch.service.store import db
from abwatch.service.store.models import ArtifactManifest, Build, BuildStatus

from webdav import WebDav

pytestmark = pytest.mark.slow  # real builds and a real server

PASSWORD = "dav-s3cret-pw"


class Said:
    """Progress that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)

    def invocation(self, workload: str, done: int, total: int) -> None:
        pass

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def fleet(tmp_path, fresh_pg_url, monkeypatch):
    """A demo repository, a store with a password, a database, and a function making hosts."""
    repo = tmp_path / "repo"
    make_demo_repo(repo)
    counts = tmp_path / "counts"
    counts.mkdir()
    store = WebDav(tmp_path / "store", password=PASSWORD).start()
    monkeypatch.setenv("ABWATCH_TEST_STORE_PW", PASSWORD)
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    sandbox.configure(SandboxConfig(writable=[str(counts)]))

    def host(name: str, url: str | None = None, password_env: str = "ABWATCH_TEST_STORE_PW") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / name))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "-c", "echo $ABWATCH_COMMIT >> {counts}/builds && sh build.sh && cp build.sh out/ && ln -s bench out/link && mkdir out/empty"]
artifacts = "out"
[[workloads]]
name = "loop"
command = ["./bench", "5"]
[artifacts]
store = {json.dumps(url or store.url)}
user = "abwatch"
password_env = {json.dumps(password_env)}
""")
        return path

    yield store, engine, host, counts / "builds"
    sandbox.reset()
    store.stop()
    engine.dispose()


def build(engine, config_path: Path, ref: str = "v1.0") -> tuple[str, Said]:
    """Build ``ref`` on the host of ``config_path``; the build's status and what was said."""
    said = Said()
    with Session(engine, expire_on_commit=False) as session:
        [outcome] = build_commits(session, make_builder(load_config(config_path)), [ref], said)
    return outcome.status, said


def builds_run(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_a_build_pushed_by_one_host_is_fetched_by_another_without_building(fleet):
    store, engine, host, counter = fleet
    status, said_a = build(engine, host("host-a"))
    assert status == "success" and builds_run(counter) == 1
    pushed = len(store.objects())
    assert pushed >= 2 and store.requests("PUT") == pushed, said_a.text()  # out/bench and out/... each once
    assert "pushed" in said_a.text()

    status, said_b = build(engine, host("host-b"))
    assert status == "success"
    assert builds_run(counter) == 1, said_b.text()  # host B never ran the build command
    assert "fetched" in said_b.text() and store.requests("GET") == pushed and store.requests("PUT") == pushed
    a_entry = next(p for p in (Path(host("host-a")).parent / "host-a" / "artifacts").iterdir() if p.is_dir()
                   and not p.name.startswith("."))
    b_entry = Path(host("host-b")).parent / "host-b" / "artifacts" / a_entry.name
    bench = b_entry / "bench"
    assert bench.read_bytes() == (a_entry / "bench").read_bytes() and bench.stat().st_mode & 0o111  # still runs
    assert (b_entry / "link").is_symlink() and (b_entry / "empty").is_dir()
    assert not (b_entry / "build.sh").stat().st_mode & 0o111
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Build)) == 1  # one build row per artifact
        manifest = session.scalars(select(ArtifactManifest)).one()
        assert manifest.artifact_key == a_entry.name and manifest.objects == pushed
    # a third build of the same artifact on host A: from its own cache, nothing sent again
    build(engine, host("host-a"))
    assert store.requests("PUT") == pushed and builds_run(counter) == 1
    assert PASSWORD not in said_a.text() + said_b.text()


def test_a_corrupt_object_is_refused_rebuilt_and_pushed_again(fleet):
    store, engine, host, counter = fleet
    build(engine, host("host-a"))
    victim = max(store.objects(), key=lambda p: p.stat().st_size)  # the benchmark binary
    good = victim.read_bytes()
    victim.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))

    status, said = build(engine, host("host-b"))
    assert status == "success" and builds_run(counter) == 2, said.text()  # refused, so built here
    assert f"object {victim.name[:12]}" in said.text() and "corrupt, refused" in said.text()
    with Session(engine) as session:
        row, own = session.scalars(select(Build).order_by(Build.id)).all()
    assert "corrupt, refused" not in row.log  # host A's build row
    assert "corrupt, refused" in own.log and own.place != row.place  # host B built it: a row of its own, its note
    # the demo build is reproducible: host B's object has the good bytes, pushed over the bad ones
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == victim.name
    status, said_c = build(engine, host("host-c"))
    assert status == "success" and builds_run(counter) == 2 and "fetched" in said_c.text()


def test_a_store_that_is_down_leaves_builds_local_and_says_so(fleet):
    store, engine, host, counter = fleet
    store.stop()
    status, said = build(engine, host("host-a"))
    assert status == "success" and builds_run(counter) == 1
    assert "artifact store:" in said.text() and "unreachable" in said.text() and "built on this host" in said.text()
    with Session(engine) as session:
        row = session.scalars(select(Build).where(Build.status == BuildStatus.SUCCESS)).one()
        assert "unreachable" in row.log  # the build's own log says why it was built here
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 0  # nothing half-stored
    status, said_b = build(engine, host("host-b"))  # another host cannot fetch it: builds too
    assert status == "success" and builds_run(counter) == 2


def test_a_wrong_password_is_a_refusal_and_the_password_is_never_shown(fleet, monkeypatch):
    store, engine, host, counter = fleet
    monkeypatch.setenv("ABWATCH_TEST_WRONG_PW", "not-the-password")
    status, said = build(engine, host("host-a", password_env="ABWATCH_TEST_WRONG_PW"))
    assert status == "success" and builds_run(counter) == 1
    assert "refused" in said.text() and "401" in said.text() and "not-the-password" not in said.text()
    assert store.objects() == []
    status, said = build(engine, host("host-b"))  # the right one: built (no manifest yet) and pushed
    assert status == "success" and "pushed" in said.text() and store.objects()


def test_the_store_url_holds_no_credentials_and_the_password_variable_is_a_secret(tmp_path):
    from abwatch.service.config import ConfigError, parse_config

    base = {"build": {"command": ["true"], "artifacts": "out"}, "repo": {"url": str(tmp_path)},
            "workloads": [{"name": "w", "command": ["true"]}]}
    for store, says in (("http://abwatch:pw@store:8080/x", "no credentials"), ("s3://bucket/x", "WebDAV"),
                        ("http://store:8080/x?token=1", "no credentials")):
        with pytest.raises(ConfigError, match=says):
            parse_config({**base, "artifacts": {"store": store}}, "fleet.toml", tmp_path)
    config = parse_config({**base, "artifacts": {"store": "http://store:8080/abwatch/", "user": "abwatch",
                                                 "password_env": "STORE_PW"}}, "fleet.toml", tmp_path)
    assert config.artifacts.store == "http://store:8080/abwatch" and "STORE_PW" in config.secret_variables()
    assert make_builder(config).store is not None


def test_cache_and_the_build_page_say_what_the_store_holds(fleet, capsys):
    """``abwatch cache`` lists which local entries are in the store and whether it answers; the
    build page names where the build's artifact was pushed, by which host."""
    store, engine, host, _ = fleet
    config = host("host-a")
    assert build(engine, config)[0] == "success"
    url = engine.url.render_as_string(hide_password=False)
    capsys.readouterr()
    assert main(["cache", "--config", str(config), "--db", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["artifact_store"]
    [key] = shown["shared"]  # the one local entry, in the store
    assert shown["store"] == store.url and shown["reachable"] is True and shown["manifests"] == 1
    assert shown["shared"][key]["objects"] == len(store.objects()) and shown["shared"][key]["build_id"] is not None
    assert main(["cache", "--config", str(config), "--db", url]) == 0
    text = capsys.readouterr().out
    assert "in store" in text and f"artifact store {store.url}: reachable; 1 artifact(s) in it" in text
    with Session(engine) as session:
        detail = build_detail(session, shown["shared"][key]["build_id"])
    assert detail["store"]["store"] == store.url and detail["store"]["objects"] == len(store.objects())
    store.stop()  # the store gone: said, and the entries' rows still read
    assert main(["cache", "--config", str(config), "--db", url, "--json"]) == 0
    gone = json.loads(capsys.readouterr().out)["artifact_store"]
    assert gone["reachable"] is False and gone["problem"] and key in gone["shared"]


def test_a_fetch_downloads_only_what_the_host_does_not_hold(fleet):
    """Host B fetched v1.0; v1.2 changes the benchmark only: its fetch downloads that object and
    links the rest from v1.0's entry (one copy on disk), and both entries stay complete."""
    store, engine, host, counter = fleet
    manifests = {}
    for tag in ("v1.0", "v1.2"):
        assert build(engine, host("host-a"), tag)[0] == "success"
        with Session(engine) as session:
            manifests[tag] = session.scalars(select(ArtifactManifest).order_by(ArtifactManifest.id.desc())).first()
    first, second = ({sha for sha, _, _ in m.manifest["files"].values()} for m in manifests.values())
    changed = second - first
    assert changed and len(changed) < len(second)  # the benchmark changed, build.sh did not

    status, said = build(engine, host("host-b"), "v1.0")
    assert status == "success" and store.requests("GET") == len(first), said.text()
    status, said = build(engine, host("host-b"), "v1.2")
    assert status == "success" and builds_run(counter) == 2, said.text()  # host B never built
    assert store.requests("GET") == len(first) + len(changed), said.text()
    assert f"{len(changed)} object(s)" in said.text() and f"and {len(second) - len(changed)} this host had" in said.text()
    cache = Path(host("host-b")).parent / "host-b" / "artifacts"
    old, new = (cache / manifests[tag].artifact_key for tag in ("v1.0", "v1.2"))
    assert (old / "build.sh").stat().st_ino == (new / "build.sh").stat().st_ino  # one copy, linked twice
    assert (old / "bench").read_bytes() != (new / "bench").read_bytes()
    assert hashlib.sha256((new / "bench").read_bytes()).hexdigest() in changed
    assert main(["cache", "--verify", "--config", str(host("host-b"))]) == 0


def test_a_build_published_between_two_reads_is_fetched_not_built_again(fleet, monkeypatch):
    """Host B reads no manifest; host A then publishes it and ends the build job; host B reads
    the job ended. The manifest is there by then (committed before the job ended): host B
    fetches it, it never builds the commit a second time."""
    from abwatch.service.compare import shared
    from abwatch.service.store import build_jobs

    store, engine, host, counter = fleet
    assert build(engine, host("host-a"))[0] == "success"
    with Session(engine) as session:  # as host B first sees it: host A's build not yet published
        published = session.scalars(select(ArtifactManifest)).one()
        hidden = {column.key: getattr(published, column.key) for column in ArtifactManifest.__table__.columns}
        session.delete(published)
        session.commit()
    read_status = build_jobs.status

    def published_meanwhile(session, key):
        with Session(engine) as other:  # host A's commit, from a connection of its own
            if other.scalar(select(func.count()).select_from(ArtifactManifest)) == 0:
                other.add(ArtifactManifest(**hidden))
                other.commit()
        return read_status(session, key)

    monkeypatch.setattr(shared.build_jobs, "status", published_meanwhile)
    status, said = build(engine, host("host-b"))
    assert status == "success" and builds_run(counter) == 1, said.text()
    assert "fetched" in said.text() and "left nothing in the store" not in said.text()
