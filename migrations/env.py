"""Alembic environment: runs migrations on the URL or connection abwatch hands it."""

from datetime import UTC, datetime
from importlib import metadata

from alembic import context
import sqlalchemy as sa
from sqlalchemy import engine_from_config, inspect, pool

from abwatch.service.store.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection) -> None:
    if connection.dialect.name == "sqlite":
        # Batch mode renames a rebuilt table into place; SQLite's modern ALTER TABLE RENAME
        # re-checks every view and fails while a view's table is the one being swapped.
        cursor = connection.connection.dbapi_connection.cursor()
        cursor.execute("PRAGMA legacy_alter_table = ON")
        cursor.close()
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def _record_version(connection) -> None:
    """Note which abwatch brought the database to its revision (``schema_versions``, from 0021 on),
    so an older abwatch that meets this revision can name the version to install. The first
    writer of a revision stays: it is the oldest abwatch that knows it."""
    revision = context.get_context().get_current_revision()
    if revision is None or not inspect(connection).has_table("schema_versions"):
        return
    try:
        version = metadata.version("abwatch")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree without install
        version = "unknown"
    table = sa.table("schema_versions", sa.column("revision", sa.String), sa.column("abwatch_version", sa.String),
                     sa.column("migrated_at", sa.DateTime(timezone=True)))
    if connection.execute(sa.select(table.c.revision).where(table.c.revision == revision)).first():
        return
    connection.execute(table.insert().values(revision=revision, abwatch_version=version, migrated_at=datetime.now(UTC)))


def _migrate(connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()
    # after it: SQLite's migrations run without one outer transaction (no transactional DDL)
    _record_version(connection)
    if connection.in_transaction():
        connection.commit()


def run_migrations_online() -> None:
    """Migrate over a live connection (the only mode abwatch uses)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        _migrate(connection)


if context.is_offline_mode():  # pragma: no cover - offline SQL generation is not used
    raise SystemExit("abwatch migrations run online only")
run_migrations_online()
