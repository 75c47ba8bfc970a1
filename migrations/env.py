"""Alembic environment: runs migrations on the URL or connection abwatch hands it."""

from alembic import context
from sqlalchemy import engine_from_config, pool

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


def run_migrations_online() -> None:
    """Migrate over a live connection (the only mode abwatch uses)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():  # pragma: no cover - offline SQL generation is not used
    raise SystemExit("abwatch migrations run online only")
run_migrations_online()
