"""Database access: which URL, the engine, and the schema (through Alembic only)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.orm import Session, sessionmaker

import migrations

DEFAULT_DATABASE_URL = "sqlite:///abwatch.db"
ENV_DATABASE_URL = "ABWATCH_DATABASE_URL"


class SchemaError(Exception):
    """The database exists but is not at the schema this abwatch expects."""


def resolve_database_url(cli_url: str | None) -> str:
    """``--db`` wins, then ``$ABWATCH_DATABASE_URL``, then the embedded SQLite file."""
    return cli_url or os.environ.get(ENV_DATABASE_URL) or DEFAULT_DATABASE_URL


def make_engine(url: str) -> Engine:
    """An engine; SQLite gets foreign keys enforced, as PostgreSQL has them."""
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    return engine


def alembic_config(url: str) -> AlembicConfig:
    """Alembic's configuration, built in code so no ini file has to be found at run time."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # '%' must be escaped for configparser interpolation (passwords may contain it).
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision(url: str) -> str:
    """The newest migration's revision id."""
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an unmigrated database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(url: str, revision: str = "head") -> None:
    """Run the migrations up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Run the migrations down to ``revision``."""
    command.downgrade(alembic_config(url), revision)


def ensure_schema(engine: Engine) -> None:
    """Migrate an empty database to head; refuse one at another revision with a clear error."""
    url = engine.url.render_as_string(hide_password=False)
    current = current_revision(engine)
    head = head_revision(url)
    if current == head:
        return
    if current is None:
        tables = set(inspect(engine).get_table_names())
        if tables:
            raise SchemaError(
                f"{engine.url.render_as_string()}: database has tables {sorted(tables)[:5]} "
                "but no abwatch schema version; refusing to touch it"
            )
        upgrade(url)
        return
    raise SchemaError(
        f"{engine.url.render_as_string()}: schema is at {current}, this abwatch needs {head}; "
        "run `abwatch db upgrade`"
    )


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
