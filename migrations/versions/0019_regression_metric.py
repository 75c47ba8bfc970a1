"""A regression says which metric opened it: ``time`` (wall time, as before) or
``instructions`` (the instructions a process retired, for workloads measured with
``measure = [..., "instructions"]``); it is verified and bisected on that metric. The
``regression_history`` view shows it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-24 20:00:00
"""
import importlib

from alembic import op
import sqlalchemy as sa


revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('regressions.metric: these regressions found on instruction counts become time ones',
     "SELECT COUNT(*) FROM regressions WHERE metric <> 'time'"),
)

_0010 = importlib.import_module("abwatch.migrations.versions.0010_workload_identity")
_0017 = importlib.import_module("abwatch.migrations.versions.0017_one_vocabulary")
_0018 = importlib.import_module("abwatch.migrations.versions.0018_fastest_series")

REGRESSION_HISTORY = _0017.REGRESSION_HISTORY.replace(
    "       r.kind AS kind,\n", "       r.kind AS kind,\n       r.metric AS metric,\n")


def _views(history: str) -> None:
    sqlite = op.get_bind().dialect.name == 'sqlite'
    op.execute(history)
    op.execute(_0018.WORKLOAD_SERIES)
    op.execute(_0010.LATEST_STATUS_SQLITE if sqlite else _0010.LATEST_STATUS_PG)


def upgrade() -> None:
    assert "r.metric AS metric" in REGRESSION_HISTORY
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    for name in _0010.VIEWS:  # SQLite rebuilds `regressions` underneath them
        op.execute(f'DROP VIEW {name}')
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('metric', sa.String(16), nullable=False, server_default='time'))
        batch.create_check_constraint('metric', sa.text("metric IN ('time', 'instructions')"))
    _views(REGRESSION_HISTORY)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    for name in _0010.VIEWS:
        op.execute(f'DROP VIEW {name}')
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(op.f('ck_regressions_metric'), type_='check')
        batch.drop_column('metric')
    _views(_0017.REGRESSION_HISTORY)
