"""A pull request cannot subvert the fleet through its data path: real builds (the ``command``
builder on git repositories made here), a real nginx store and PostgreSQL, no mocks.

- a build whose ``artifacts`` is a link to a host directory is refused, and the host's secret
  is in no cache entry, store object or log; a link inside the artifacts to a host file is not
  followed (dropped, said);
- a manifest planted in ``artifact_manifests`` with a ``../`` path, an object name that is a path,
  an absolute path, a setuid mode or a link out of the artifact is refused, said (the commit and
  the fault), the commit built locally, and ``compare`` exits 0/1, never 5;
- a manifest rewritten without the fleet's key (real objects put to the store, a missing or
  wrong MAC) is never used: the commit is built locally from its own code;
- an untrusted (try) build pushes nothing, writes no manifest and has no remote compiler cache.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path

import git
import pytest
import requests
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from abwatch.builders import make_builder, sandbox
from abwatch.builders.artifact_store import ArtifactStore, InvalidManifest, NoManifestKey, canonical, validate_manifest
from abwatch.builders.safe_copy import UnsafeArtifact, confine, copy_tree, inside
from abwatch.builders.spec import ArtifactsConfig, SandboxConfig, TvmSourceBuildConfig
from abwatch.service.cli.demo import make_demo_repo
from abwatch.service.cli.main import main
from abwatch.service.compare import driver
from abwatch.service.compare.building import build_commits
from abwatch.service.config import load_config
from abwatch.service.store import db
from abwatch.service.store.models import ArtifactManifest, Build, BuildStatus

from conftest import MANIFEST_KEY
from test_artifact_store import PASSWORD, Said, builds_run
from webdav import WebDav

SECRET = "hunter2-SECRET-of-the-host"
SHA = "ab" * 32


# --- what a manifest may say (no servers) ---------------------------------------------------

GOOD = {"files": {"bench": [SHA, 10, 0o755], "lib/a.so": [SHA, 10, 0o644]},
        "links": {"link": "bench", "venv/bin/python": "/usr/bin/python3.11", "lib/b.so": "a.so"},
        "dirs": ["empty"]}


@pytest.mark.parametrize("manifest, fault", [
    ({"files": {"../../etc/hostB.toml": [SHA, 1, 0o644]}}, "leaves the artifact"),
    ({"files": {"bench": ["../../../hostB.toml", 1, 0o644]}}, "not a SHA-256"),
    ({"files": {"bench": [SHA.upper(), 1, 0o644]}}, "not a SHA-256"),
    ({"files": {"/etc/passwd": [SHA, 1, 0o644]}}, "absolute path"),
    ({"files": {"a\0b": [SHA, 1, 0o644]}}, "NUL"),
    ({"files": {"./bench": [SHA, 1, 0o644]}}, "canonical"),
    ({"files": {"bench": [SHA, -1, 0o644]}}, "non-negative"),
    ({"files": {"bench": [SHA, True, 0o644]}}, "non-negative"),
    ({"files": {"bench": [SHA, 1, 0o4755]}}, "0o777"),
    ({"files": {"bench": [SHA, 1, 0o1777]}}, "0o777"),
    ({"files": {".abwatch-complete": [SHA, 1, 0o644]}}, "abwatch's cache"),
    ({"files": {}, "links": {"leak": "/root/.pgpass"}}, "leads outside"),
    ({"files": {}, "links": {"a/leak": "../../x"}}, "leads outside"),
    ({"files": {"d": [SHA, 1, 0o644], "d/f": [SHA, 1, 0o644]}}, "lies under"),
    ({"files": {"d/f": [SHA, 1, 0o644]}, "links": {"d": "elsewhere"}}, "lies under"),
    ({"files": {}, "extra": 1}, "not a manifest"),
    ([], "not a manifest"),
])
def test_every_manifest_entry_is_checked_before_use(manifest, fault):
    validate_manifest(GOOD)
    with pytest.raises(InvalidManifest, match=fault):
        validate_manifest(manifest)


def test_a_manifest_is_used_only_with_the_fleets_mac(monkeypatch):
    store = ArtifactStore("http://store.invalid/x", manifest_key_env="ABWATCH_MANIFEST_KEY")
    mac = store.sign("key-1", GOOD)
    assert mac == hmac.new(MANIFEST_KEY.encode(), canonical("key-1", GOOD), hashlib.sha256).hexdigest()
    assert store.check("key-1", GOOD, mac) == GOOD
    for key, manifest, bad in (("key-1", GOOD, None), ("key-1", GOOD, "0" * 64), ("key-2", GOOD, mac),
                               ("key-1", {**GOOD, "dirs": ["other"]}, mac)):
        with pytest.raises(InvalidManifest, match="MAC"):
            store.check(key, manifest, bad)


@pytest.mark.slow  # over 2.5 s under load (processes, servers, migrations)
def test_a_store_without_its_manifest_key_refuses_to_start(monkeypatch, tmp_path, capsys):
    config = ArtifactsConfig(store="http://store.invalid/x")
    monkeypatch.delenv("ABWATCH_MANIFEST_KEY")
    with pytest.raises(NoManifestKey, match=r"\$ABWATCH_MANIFEST_KEY"):
        ArtifactStore.from_config(config)
    monkeypatch.setenv("ABWATCH_MANIFEST_KEY", "short")
    with pytest.raises(NoManifestKey, match="shorter than 32"):
        ArtifactStore.from_config(config)
    assert ArtifactStore.from_config(config, need_key=False) is not None  # reading what the store holds
    repo = tmp_path / "repo"
    make_demo_repo(repo)
    path = tmp_path / "c.toml"
    path.write_text(f'cache_dir = "{tmp_path}/c"\n[repo]\nurl = "{repo}"\n[build]\ncommand = ["sh", "build.sh"]\n'
                    f'artifacts = "out"\n[[workloads]]\nname = "loop"\ncommand = ["./bench", "5"]\n'
                    f'[artifacts]\nstore = "http://store.invalid/x"\n')
    assert main(["compare", "--config", str(path), "--db", f"sqlite:///{tmp_path}/a.db", "--control", "v1.0",
                 "--treatment", "v1.0"]) == 2
    assert "ABWATCH_MANIFEST_KEY" in capsys.readouterr().err


# --- safe copies (no servers) ---------------------------------------------------------------

def test_copies_follow_no_link_out_and_keep_no_special_bits(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "pgpass").write_text(SECRET)
    src = tmp_path / "checkout" / "out"
    (src / "bin").mkdir(parents=True)
    (src / "f").write_text("ok")
    os.chmod(src / "f", 0o4755)
    (src / "leak").symlink_to(host / "pgpass")
    (src / "up").symlink_to("../../host/pgpass")
    (src / "dir-leak").symlink_to(host)
    (src / "ok").symlink_to("f")
    (src / "bin" / "python").symlink_to("/usr/bin/python3")
    os.mkfifo(src / "fifo")
    notes = copy_tree(src, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert sorted(p.name for p in copy.iterdir()) == ["bin", "f", "ok"]
    assert stat.S_IMODE((copy / "f").stat().st_mode) == 0o755 and os.readlink(copy / "ok") == "f"
    assert not (copy / "bin" / "python").exists()  # only a venv's interpreter link is kept, when allowed
    text = "".join(notes)
    assert "leak" in text and "dir-leak" in text and "up" in text and "fifo" in text and SECRET not in text
    with pytest.raises(UnsafeArtifact, match="symbolic link"):
        copy_tree(src / "dir-leak", tmp_path / "copy2")
    with pytest.raises(UnsafeArtifact, match="dir-leak"):
        inside(src.parent, "out/dir-leak/pgpass")
    notes = confine(src)
    assert sorted(p.name for p in src.iterdir()) == ["bin", "f", "ok"] and "fifo" in "".join(notes)


# --- hostile builds against a real store ----------------------------------------------------

def hostile_repo(path: Path, script: str) -> None:
    """A git repository (GitPython) whose one commit, tagged v1, builds with ``script``."""
    repo = git.Repo.init(path, initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t")
        cfg.set_value("user", "email", "t@abwatch.invalid")
    (path / "build.sh").write_text(script)
    repo.index.add(["build.sh"])
    repo.index.commit("hostile")
    repo.create_tag("v1")


@pytest.fixture
def fleet(tmp_path, fresh_pg_url, monkeypatch):
    """A store with a password, a migrated database, a host directory holding a secret, and a
    function making a host's config for a repository."""
    secrets = tmp_path / "host-secrets"
    secrets.mkdir()
    (secrets / ".pgpass").write_text(f"db:5432:*:abwatch:{SECRET}\n")
    store = WebDav(tmp_path / "store", password=PASSWORD).start()
    monkeypatch.setenv("ABWATCH_TEST_STORE_PW", PASSWORD)
    db.upgrade(fresh_pg_url)
    engine = db.make_engine(fresh_pg_url)
    counts = tmp_path / "counts"
    counts.mkdir()
    sandbox.configure(SandboxConfig(writable=[str(counts)]))

    def host(name: str, repo: Path, command: str = "sh build.sh", extra: str = "") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f"""
cache_dir = {json.dumps(str(tmp_path / name))}
[repo]
url = {json.dumps(str(repo))}
[build]
command = ["sh", "-c", {json.dumps(f"echo $ABWATCH_COMMIT >> {counts}/builds && {command}")}]
artifacts = "out"
[[workloads]]
name = "loop"
command = ["./bench", "5"]
[run]
repetitions = 4
max_repetitions = 4  # these compares check the artifacts, not a verdict: no extra looks on a busy host
noise_aware = false
[sandbox]
writable = [{json.dumps(str(counts))}]
[artifacts]
store = {json.dumps(store.url)}
user = "abwatch"
password_env = "ABWATCH_TEST_STORE_PW"
{extra}""")
        return path

    yield store, engine, host, secrets, counts / "builds", fresh_pg_url
    sandbox.reset()
    store.stop()
    engine.dispose()


def build(engine, config: Path, ref: str = "v1", untrusted: bool = False):
    said = Said()
    cfg = load_config(config)
    if untrusted:
        cfg = cfg.model_copy(update={"build": cfg.build.for_untrusted()})
    builder = make_builder(cfg)
    with Session(engine, expire_on_commit=False) as session:
        [outcome] = build_commits(session, builder, [ref], said)
        row = session.get(Build, outcome.build_id)
    return outcome, row, said, builder


def everything_under(*roots: Path) -> bytes:
    """Every byte of every file under ``roots`` (links not followed)."""
    found = b""
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                path = Path(dirpath) / name
                if not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode):
                    found += path.read_bytes()
    return found


@pytest.mark.slow
def test_an_artifacts_link_to_a_host_directory_is_refused_and_the_secret_goes_nowhere(fleet, tmp_path):
    store, engine, host, secrets, _, _ = fleet
    hostile_repo(tmp_path / "repo", f"ln -s {secrets} out\n")
    outcome, row, said, _ = build(engine, host("host-a", tmp_path / "repo"))
    assert outcome.status == BuildStatus.BUILD_FAILED.value, said.text()
    assert "'out'" in outcome.message and "symbolic link" in outcome.message  # names the path
    assert SECRET not in row.log and SECRET not in said.text()
    assert SECRET.encode() not in everything_under(tmp_path / "host-a", tmp_path / "store")
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 0
    # a path through a link inside the checkout is refused too
    hostile_repo(tmp_path / "repo2", f"mkdir real && ln -s {secrets} real/out && ln -s real/out out\n")
    outcome, row, said, _ = build(engine, host("host-b", tmp_path / "repo2"))
    assert outcome.status == BuildStatus.BUILD_FAILED.value and "symbolic link" in outcome.message


@pytest.mark.slow
def test_a_link_inside_the_artifacts_to_a_host_file_is_not_followed(fleet, tmp_path):
    store, engine, host, secrets, _, _ = fleet
    hostile_repo(tmp_path / "repo", f"mkdir -p out/d && echo ok > out/f && ln -s {secrets}/.pgpass out/leak && "
                                    f"ln -s ../../../../../../../..{secrets} out/d/up && ln -s f out/ok\n")
    outcome, row, said, builder = build(engine, host("host-a", tmp_path / "repo"))
    assert outcome.status == "success", said.text()
    entry = builder.cache.path(builder.cache_key(outcome.sha))
    assert not os.path.lexists(entry / "leak") and not os.path.lexists(entry / "d" / "up")
    assert os.readlink(entry / "ok") == "f"
    assert "dropped the symbolic link leak" in row.log and "dropped the symbolic link d/up" in row.log
    assert SECRET not in row.log and SECRET.encode() not in everything_under(tmp_path / "host-a", tmp_path / "store")
    with Session(engine) as session:
        manifest = session.scalars(select(ArtifactManifest)).one().manifest
    assert manifest["links"] == {"ok": "f"}


def demo_fleet(fleet, tmp_path):
    """Host A built and pushed v1.0 of the demo repository (a signed manifest)."""
    store, engine, host, _, counter, url = fleet
    repo = tmp_path / "demo"
    make_demo_repo(repo)
    outcome, _, said, builder = build(engine, host("host-a", repo, "sh build.sh"), "v1.0")
    assert outcome.status == "success" and "pushed" in said.text()
    return repo, builder.cache_key(outcome.sha), outcome.sha


def plant(engine, key: str, manifest: dict, mac: str | None) -> None:
    with Session(engine) as session:
        session.execute(update(ArtifactManifest).where(ArtifactManifest.artifact_key == key)
                        .values(manifest=manifest, mac=mac))
        session.commit()


def compare(config: Path, url: str, capsys) -> tuple[int, str]:
    status = main(["compare", "--config", str(config), "--db", url, "--control", "v1.0", "--treatment", "v1.0"])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def signed(key: str, manifest: dict) -> str:
    return hmac.new(MANIFEST_KEY.encode(), canonical(key, manifest), hashlib.sha256).hexdigest()


@pytest.mark.slow
def test_a_malformed_manifest_is_refused_said_and_the_commit_built_locally(fleet, tmp_path, capsys):
    store, engine, host, _, counter, url = fleet
    repo, key, sha = demo_fleet(fleet, tmp_path)
    with Session(engine) as session:
        good = session.scalars(select(ArtifactManifest)).one().manifest
    bench_sha, bench_size, _ = good["files"]["bench"]
    config_b = host("host-b", repo, "sh build.sh")
    cache_b = tmp_path / "host-b" / "artifacts"
    # the host's own config, reached from the cache's object store by an object "name"
    to_config = os.path.relpath(config_b, cache_b / ".objects" / "ab")
    cases = [
        ({**good, "files": {**good["files"], "bench": [to_config, config_b.stat().st_size,
                                                        stat.S_IMODE(config_b.stat().st_mode)]}}, "not a SHA-256"),
        ({**good, "files": {**good["files"], "../../../escaped": [bench_sha, bench_size, 0o755]}}, "leaves the artifact"),
        ({**good, "files": {**good["files"], "bench": ["zz" * 32, bench_size, 0o755]}}, "not a SHA-256"),
        ({**good, "files": {**good["files"], "/tmp/abwatch-planted": [bench_sha, bench_size, 0o755]}}, "absolute path"),
        ({**good, "files": {**good["files"], "bench": [bench_sha, bench_size, 0o4755]}}, "0o777"),
        ({**good, "links": {"leak": str(config_b)}}, "leads outside"),
    ]
    runs = builds_run(counter)
    for n, (manifest, fault) in enumerate(cases):
        plant(engine, key, manifest, signed(key, manifest))  # even a manifest with the key's MAC is checked
        if n < 2:  # a whole comparison: judged, never exit 5 (the others take the same path, built only)
            status, text = compare(config_b, url, capsys)
            assert status in (0, 1), text
        else:
            outcome, _, said, _ = build(engine, config_b, "v1.0")
            status, text = outcome.status, said.text()
            assert status == "success", text
        assert f"the manifest of {key} (commit {sha[:12]}) is not used" in text and fault in text, text
        assert builds_run(counter) == runs + 1, text  # built on host B
        runs += 1
        assert os.stat(config_b).st_nlink == 1  # never linked into an artifact
        assert not (tmp_path / "escaped").exists() and not Path("/tmp/abwatch-planted").exists()
        for entry in cache_b.iterdir():  # host B's own build replaced it: drop it for the next case
            if entry.is_dir() and not entry.name.startswith("."):
                for path in entry.rglob("*"):
                    assert not path.is_symlink() or not os.path.isabs(os.readlink(path)), path
                    assert not (path.is_file() and path.stat().st_mode & 0o7000), path
                host_b_entry = entry
        builder_b = make_builder(load_config(config_b))
        builder_b.cache.discard(host_b_entry.name)
        with Session(engine) as session:  # host B wrote its own signed manifest over the planted one
            row = session.scalars(select(ArtifactManifest)).one()
            assert row.mac == signed(key, row.manifest) and row.manifest["files"]["bench"][0] == bench_sha


@pytest.mark.slow
def test_a_manifest_rewritten_without_the_key_is_never_used(fleet, tmp_path, capsys):
    store, engine, host, _, counter, url = fleet
    repo, key, sha = demo_fleet(fleet, tmp_path)
    # the attacker's code: another commit's benchmark, built and PUT as a real object of the store
    outcome, _, _, builder = build(engine, host("attacker", repo, "sh build.sh"), "v1.2")
    evil = (builder.cache.path(builder.cache_key(outcome.sha)) / "bench").read_bytes()
    evil_sha = hashlib.sha256(evil).hexdigest()
    requests.put(f"{store.url}/cas/{evil_sha}", data=evil, auth=("abwatch", PASSWORD), timeout=10).raise_for_status()
    with Session(engine) as session:
        good = session.scalars(select(ArtifactManifest).where(ArtifactManifest.artifact_key == key)).one().manifest
    own = next(o for o in store.objects() if o.name == good["files"]["bench"][0]).read_bytes()
    assert own != evil
    forged = {**good, "files": {**good["files"], "bench": [evil_sha, len(evil), 0o755]}}
    wrong_key = hmac.new(b"guessed-key-guessed-key-guessed-key!", canonical(key, forged), hashlib.sha256).hexdigest()
    for n, mac in enumerate((None, wrong_key, signed(key, good))):  # missing, wrong, the good manifest's MAC
        plant(engine, key, forged, mac)
        runs = builds_run(counter)
        config = host(f"device-{n}", repo, "sh build.sh")
        if n == 0:  # a trusted comparison of the commit: it measures its own build
            status, text = compare(config, url, capsys)
            assert status in (0, 1), text
        else:
            outcome, _, said, _ = build(engine, config, "v1.0")
            assert outcome.status == "success", said.text()
            text = said.text()
        assert "is not used" in text and "MAC" in text and builds_run(counter) == runs + 1, text
        entry = tmp_path / f"device-{n}" / "artifacts" / key
        assert (entry / "bench").read_bytes() == own  # it measured its own build of the commit
        with Session(engine) as session:
            row = session.scalars(select(ArtifactManifest).where(ArtifactManifest.artifact_key == key)).one()
            assert row.mac == signed(key, row.manifest) and row.manifest == good
    assert MANIFEST_KEY not in text


@pytest.mark.slow
def test_an_untrusted_build_pushes_nothing_and_writes_no_manifest(fleet, tmp_path):
    store, engine, host, _, counter, url = fleet
    repo = tmp_path / "demo"
    make_demo_repo(repo)
    config = host("try-host", repo, "sh build.sh")
    outcome, _, said, builder = build(engine, config, "v1.0", untrusted=True)
    assert outcome.status == "success" and builder.untrusted and builder.store is None, said.text()
    assert store.requests("PUT") == 0 and store.requests("HEAD") == 0 and store.objects() == []
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 0
    with pytest.raises(ValueError, match="untrusted"):
        builder.store = ArtifactStore(store.url)
    # its key is its own: a trusted build of the same commit never takes the untrusted artifact
    trusted = make_builder(load_config(config))
    assert trusted.store is not None and trusted.cache_key(outcome.sha) != builder.cache_key(outcome.sha)
    # a whole try comparison (what run_try runs after for_untrusted)
    cfg = load_config(config)
    cfg = cfg.model_copy(update={"build": cfg.build.for_untrusted()})
    with Session(engine, expire_on_commit=False) as session:
        result = driver.run_compare(session, cfg, "v1.0", "v1.2")
    assert result.status in ("completed", "regression", "no_regression", "done") or result.results
    assert store.requests("PUT") == 0 and store.objects() == []
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(ArtifactManifest)) == 0


def test_an_untrusted_tvm_source_build_has_no_remote_compiler_cache(tmp_path):
    from abwatch.builders.tvm_source import TvmSourceBuilder

    class Settings:
        repo = type("R", (), {"url": str(tmp_path / "repo")})()
        cache_dir = tmp_path / "cache"
        from abwatch.builders.spec import CacheConfig
        cache = CacheConfig()
        artifacts = ArtifactsConfig(store="http://store.invalid/x")

    spec = TvmSourceBuildConfig(ccache_remote="redis://cache.invalid:6379", ccache_remote_password_env="PW")
    Settings.build = spec
    assert make_builder(Settings()).compiler_cache.remote == "redis://cache.invalid:6379"
    for untrusted in (spec.for_untrusted(), spec.model_copy(update={"untrusted": True})):  # even if not cleared
        Settings.build = untrusted
        builder = make_builder(Settings())
        assert isinstance(builder, TvmSourceBuilder) and builder.untrusted
        assert builder.compiler_cache.remote is None and builder.store is None
        assert builder.compiler_cache.env()["CCACHE_REMOTE_STORAGE"] == ""
