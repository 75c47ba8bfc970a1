"""Database access: which URL, the engine, and the schema (through Alembic only)."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

from dataclasses import dataclass
from importlib import metadata

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.util.exc import CommandError
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from abwatch import migrations
from abwatch.core.errors import UsageError
from abwatch.core.redact import mask_url
from abwatch.service.store import locks, masking  # noqa: F401  (masking: secrets masked in every flush)

DEFAULT_DATABASE_URL = "sqlite:///abwatch.db"
ENV_DATABASE_URL = "ABWATCH_DATABASE_URL"


class SchemaError(UsageError):
    """The database exists but is not at the schema this abwatch expects."""


class DatabaseUrlError(SchemaError):
    """A database URL abwatch cannot use (not a URL, or a driver it does not ship)."""


def resolve_database_url(cli_url: str | None) -> str:
    """``--db`` wins, then ``$ABWATCH_DATABASE_URL``, then the embedded SQLite file."""
    return cli_url or os.environ.get(ENV_DATABASE_URL) or DEFAULT_DATABASE_URL


def normalize_url(url: str) -> str:
    """``url`` with the driver abwatch ships: ``postgresql://`` and ``postgres://`` mean psycopg2.

    SQLAlchemy would pick psycopg 3 for a bare ``postgresql://`` (not installed), and does not
    know ``postgres://`` at all, although both are what PostgreSQL's documentation and most
    hosting services hand out. Raises :class:`DatabaseUrlError` for what cannot be a URL.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseUrlError(f"{mask_url(url)!r} is not a database URL; "
                               "use sqlite:///FILE or postgresql://USER@HOST/DATABASE") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed.render_as_string(hide_password=False)


# libpq's network settings for every PostgreSQL connection: a connect gives up after 10 s, an idle
# connection is probed after 30 s of silence (three probes 10 s apart), and data unacknowledged
# for 60 s drops it. A worker whose host lost the network then reconnects (and the server frees
# its advisory locks) instead of waiting on a dead socket.
LIBPQ_NETWORK = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                 "keepalives_count": 3, "tcp_user_timeout": 60_000}


def make_engine(url: str, *, pool_size: int | None = None, pool_timeout_s: float | None = None,
                statement_timeout_s: float | None = None) -> Engine:
    """An engine; SQLite gets foreign keys enforced, as PostgreSQL has them.

    Connections are checked when taken from the pool (a restarted server's are replaced).
    ``pool_size`` makes the pool exactly that many connections (no overflow), waited for at most
    ``pool_timeout_s``; ``statement_timeout_s`` sets PostgreSQL's ``statement_timeout`` on every
    connection (``abwatch serve``'s deadlines; SQLite has no such setting and ignores it).
    """
    url = normalize_url(url)
    folder = sqlite_folder(url)
    if folder is not None and not folder.is_dir():  # SQLite would say only "unable to open database file"
        raise DatabaseUrlError(f"{make_url(url).render_as_string()}: the directory {folder} does not exist; "
                               "create it, or name a database elsewhere (--db)")
    pool: dict = {}
    if pool_size is not None and make_url(url).database not in (None, "", ":memory:"):
        pool = {"pool_size": pool_size, "max_overflow": 0}
        if pool_timeout_s is not None:
            pool["pool_timeout"] = pool_timeout_s
    if make_url(url).get_backend_name() == "postgresql":
        # a host cut off from the server (or the server's host gone) is noticed in about a minute,
        # not after the kernel's two hours: what the URL says wins
        given = set(make_url(url).query)
        pool["connect_args"] = {k: v for k, v in LIBPQ_NETWORK.items() if k not in given}
    try:
        # pre-ping: a connection the server dropped (a restart) is replaced when it is taken
        # from the pool, so a long-running worker does not fail on its first query after one
        engine = create_engine(url, future=True, pool_pre_ping=True, **pool)
    except (NoSuchModuleError, ImportError) as exc:
        raise DatabaseUrlError(f"{make_url(url).render_as_string()}: unknown database driver "
                               f"{make_url(url).drivername!r} ({exc}); abwatch supports sqlite:/// "
                               "and postgresql:// (psycopg2)") from None
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    elif statement_timeout_s is not None:
        milliseconds = max(1, round(statement_timeout_s * 1000))

        @event.listens_for(engine, "connect")
        def _statement_timeout(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET statement_timeout = {milliseconds:d}")
            cursor.close()
            dbapi_connection.commit()  # a SET in a transaction rolled back later would be undone
    return engine


def alembic_config(url: str) -> AlembicConfig:
    """Alembic's configuration, built in code so no ini file has to be found at run time."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # '%' must be escaped for configparser interpolation (passwords may contain it).
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def head_revision(url: str) -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    if head is None:  # the package always ships its migrations
        raise SchemaError("no migrations found")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an unmigrated database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


@contextmanager
def schema_lock(engine: Engine) -> Iterator[None]:
    """Hold the lock under which the schema is checked and migrated.

    Two processes that open an empty database at once must not both create its tables: on
    PostgreSQL they take an advisory lock (the second waits, then finds the schema at head);
    on an SQLite file, a file lock next to it.
    """
    if engine.dialect.name == "postgresql":
        with locks.advisory(engine, locks.SCHEMA_LOCK, 0, "abwatch migrate"):
            yield
        return
    database = engine.url.database
    if not database or database == ":memory:":  # one connection's own database: nobody to wait for
        yield
        return
    path = Path(database).resolve()
    with locks.file_lock(path.with_name(f".{path.name}.migrate.lock"), "abwatch migrate"):
        yield


def abwatch_version() -> str:
    """This abwatch's version (the installed package's)."""
    try:
        return metadata.version("abwatch")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "unknown"


def _script(url: str) -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config(url))


def knows_revision(url: str, revision: str) -> bool:
    """Whether this abwatch's migrations have ``revision``."""
    try:
        _script(url).get_revision(revision)
    except CommandError:
        return False
    return True


def newer_schema(engine: Engine, current: str | None) -> SchemaError | None:
    """The error for a database at a revision this abwatch does not know (a newer abwatch
    migrated it), naming the version to install from ``schema_versions``; None otherwise.

    ``abwatch db upgrade`` cannot help there (it knows no way up or back from that revision).
    """
    url = engine.url.render_as_string(hide_password=False)
    if current is None or knows_revision(url, current):
        return None
    wrote = None
    if inspect(engine).has_table("schema_versions"):
        with engine.connect() as connection:
            wrote = connection.execute(text("SELECT abwatch_version FROM schema_versions WHERE revision = :r"),
                                       {"r": current}).scalar()
    who = f"abwatch {wrote}" if wrote else "a newer abwatch"
    install = (f"install abwatch {wrote} or newer (pip install 'abwatch>={wrote}')" if wrote
               else "install the abwatch that migrated it")
    return SchemaError(
        f"{engine.url.render_as_string()}: schema revision {current} is newer than this abwatch "
        f"({abwatch_version()}, schema {head_revision(url)}) knows: {who} migrated it; {install}. "
        "`abwatch db upgrade` cannot change that; nothing was changed")


def _refuse_newer(engine: Engine) -> None:
    error = newer_schema(engine, current_revision(engine))
    if error is not None:
        raise error


def upgrade(url: str, revision: str = "head") -> None:
    """Run the migrations up to ``revision`` (under :func:`schema_lock`); a database newer
    than this abwatch is refused with :func:`newer_schema`'s message."""
    engine = make_engine(url)
    try:
        with schema_lock(engine):
            _refuse_newer(engine)
            command.upgrade(alembic_config(url), revision)
    finally:
        engine.dispose()


@dataclass(frozen=True)
class Loss:
    """Data a downgrade drops or changes: the migration whose ``downgrade()`` does it, what, how many rows."""

    revision: str
    what: str
    rows: int


def downgrade_losses(url: str, revision: str) -> list[Loss]:
    """What a downgrade to ``revision`` would drop or change, counted on the database now.

    Each migration lists its downgrade's losses as ``DOWNGRADE_LOSES`` (what, a counting SQL
    query); only those with rows are returned, newest migration first.
    """
    engine = make_engine(url)
    try:
        _refuse_newer(engine)
        current = current_revision(engine)
        if revision != "base" and not knows_revision(url, revision):
            raise SchemaError(f"--revision {revision!r}: no such schema revision (`abwatch db current` "
                              f"prints the database's; this abwatch knows up to {head_revision(url)})")
        if current is None:
            return []
        losses = []
        with engine.connect() as connection:
            for script in _script(url).iterate_revisions(current, revision):
                for what, query in getattr(script.module, "DOWNGRADE_LOSES", ()):
                    rows = connection.execute(text(query)).scalar() or 0
                    if rows:
                        losses.append(Loss(script.revision, what, int(rows)))
        return losses
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    """Run the migrations down to ``revision`` (under :func:`schema_lock`). Callers that keep
    data ask :func:`downgrade_losses` first (the command line does, and wants ``--yes``)."""
    engine = make_engine(url)
    try:
        with schema_lock(engine):
            _refuse_newer(engine)
            command.downgrade(alembic_config(url), revision)
    finally:
        engine.dispose()


def ensure_schema(engine: Engine) -> None:
    """Migrate an empty database to head; refuse one at another revision with a clear error."""
    url = engine.url.render_as_string(hide_password=False)
    head = head_revision(url)
    if current_revision(engine) == head:
        return
    # checked again under the lock: another process may be creating the schema right now
    with schema_lock(engine):
        _ensure_schema_locked(engine, url, head)


def _ensure_schema_locked(engine: Engine, url: str, head: str) -> None:
    current = current_revision(engine)
    if current == head:
        return
    if current is None:
        tables = set(inspect(engine).get_table_names())
        if tables == {"alembic_version"}:
            # what `abwatch db downgrade --revision base` leaves: say how to come back
            raise SchemaError(
                f"{engine.url.render_as_string()}: schema was downgraded to base (no tables); "
                "run `abwatch db upgrade` to create it again"
            )
        if tables:
            raise SchemaError(
                f"{engine.url.render_as_string()}: database has tables {sorted(tables)[:5]} "
                "but no abwatch schema version; refusing to touch it (an abwatch database "
                "downgraded by hand: `abwatch db upgrade`)"
            )
        command.upgrade(alembic_config(url), "head")  # the lock is held already
        return
    _refuse_newer(engine)
    raise SchemaError(
        f"{engine.url.render_as_string()}: schema is at {current}, this abwatch needs {head}; "
        "run `abwatch db upgrade`"
    )


def check_schema(engine: Engine) -> None:
    """For commands that only read: the database must be at head already; never migrates, and
    never creates a SQLite file that is not there (connecting would)."""
    if (missing := missing_database(engine.url.render_as_string(hide_password=False))) is not None:
        raise SchemaError(f"{engine.url.render_as_string()}: {missing}; a command that only reads does not create "
                          "one (run `abwatch db upgrade`, or a command that writes such as `abwatch compare`)")
    current = current_revision(engine)
    head = head_revision(engine.url.render_as_string(hide_password=False))
    if current == head:
        return
    where = engine.url.render_as_string()
    if current is None:
        raise SchemaError(f"{where}: no abwatch schema here; a command that only reads does not create one "
                          "(run `abwatch db upgrade`, or a command that writes such as `abwatch compare`)")
    _refuse_newer(engine)
    raise SchemaError(f"{where}: schema is at {current}, this abwatch needs {head}; run `abwatch db upgrade`")


def sqlite_folder(url: str) -> Path | None:
    """The directory of a SQLite database file (None for PostgreSQL or an in-memory database)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).parent


def missing_database(url: str) -> str | None:
    """Why there is nothing to read at ``url``: a SQLite file that does not exist (``abwatch
    cache`` reads a database only where one is: it never creates the file); else None."""
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() == "sqlite" and parsed.database and not Path(parsed.database).exists():
        return f"no database at {parsed.database} (--db names one)"
    return None


def open_database(url: str, *, write: bool) -> Engine:
    """An engine on ``url`` whose schema is at head.

    Commands that write migrate an empty database (never one that holds other tables);
    commands that only read never migrate anything.
    """
    engine = make_engine(url)
    if write:
        ensure_schema(engine)
    else:
        check_schema(engine)
    return engine


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    factory = sessionmaker(engine, expire_on_commit=False)
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


READONLY_PASSWORD_ENV = "ABWATCH_READONLY_PASSWORD"
# Every way to take an advisory lock: a reader that could call them could take a device's
# lock (service.store.locks) and hold every measurement on that device up.
ADVISORY_FUNCTIONS = tuple(f"{name}({args})" for name in (
    "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared",
    "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared") for args in ("bigint", "integer, integer"))
_ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def grant_readonly(engine: Engine, role: str) -> list[str]:
    """Make ``role`` (created if missing) able to read every table and view and do nothing else.

    PostgreSQL only. The role gets CONNECT, USAGE on the schema, SELECT on all tables and
    views (and on ones later migrations create), and read-only transactions by default.
    Its password, if any, comes from ``$ABWATCH_READONLY_PASSWORD``. Returns the statements run.

    What every role gets from PUBLIC is taken back in this database and given to the role
    running this (abwatch's writer) alone: temporary tables, and the advisory lock functions
    (a reader could otherwise take a device's lock and stall its measurements). Revoking a
    built-in function's EXECUTE needs a superuser; otherwise a WARNING line says the reader can
    still take advisory locks.
    """
    if engine.dialect.name != "postgresql":
        raise SchemaError(f"{engine.url.render_as_string()}: grant-readonly needs PostgreSQL "
                          "(an SQLite file is read-only by its file permissions)")
    if not _ROLE_NAME.fullmatch(role):
        raise SchemaError(f"role {role!r}: a role name is letters, digits and '_' (not starting with a digit)")
    quote = engine.dialect.identifier_preparer.quote_identifier
    name = quote(role)
    password = os.environ.get(READONLY_PASSWORD_ENV)
    with engine.begin() as connection:
        database = quote(connection.exec_driver_sql("SELECT current_database()").scalar_one())
        writer = quote(connection.exec_driver_sql("SELECT current_user").scalar_one())
        functions = ", ".join(ADVISORY_FUNCTIONS)
        exists = connection.exec_driver_sql("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).first()
        statements = [] if exists else [f"CREATE ROLE {name} LOGIN NOINHERIT"]
        statements += [
            f"GRANT CONNECT ON DATABASE {database} TO {name}",
            f"REVOKE CREATE, TEMPORARY ON DATABASE {database} FROM {name}",
            f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC",  # what every role had
            f"GRANT TEMPORARY ON DATABASE {database} TO {writer}",
            f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC",
            f"GRANT EXECUTE ON FUNCTION {functions} TO {writer}",
            f"GRANT USAGE ON SCHEMA public TO {name}",
            f"REVOKE CREATE ON SCHEMA public FROM {name}",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {name}",
            # tables and views the migrations add later are readable too
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {name}",
            f"ALTER ROLE {name} SET default_transaction_read_only = on",
        ]
        for statement in statements:
            connection.exec_driver_sql(statement)
        if password:
            # psycopg2 quotes the parameter client-side, so the password is never spliced in by hand
            connection.exec_driver_sql(f"ALTER ROLE {name} PASSWORD %s", (password,))
            statements.append(f"ALTER ROLE {name} PASSWORD '***'")
        if connection.exec_driver_sql("SELECT has_function_privilege(%s, 'pg_try_advisory_lock(integer, integer)', "
                                      "'EXECUTE')", (role,)).scalar():
            statements.append(f"WARNING: {role} can still take advisory locks (device locks): revoking EXECUTE on "
                              "PostgreSQL's own functions needs a superuser; run grant-readonly as one")
    return statements


def lost_connection(exc: BaseException) -> BaseException | None:
    """The database error that lost the connection, if that is what ``exc`` (or an error it was
    raised from or during) comes down to; None otherwise.

    A session used after its connection died raises ``PendingRollbackError``, which names the
    wrong cause; the first ``OperationalError``/``InterfaceError`` in the chain is the real one.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError) and (
                current.connection_invalidated or isinstance(current, (OperationalError, InterfaceError))):
            return current
        current = current.__cause__ or current.__context__
    return None
