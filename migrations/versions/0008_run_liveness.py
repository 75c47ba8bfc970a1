"""Runs know who runs them (host, pid, process start, heartbeat) and end incomplete, interrupted or abandoned.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 08:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('runs.status: these incomplete, interrupted or abandoned runs become failed',
     "SELECT COUNT(*) FROM runs WHERE status IN ('incomplete', 'interrupted', 'abandoned')"),
)

OLD = ('running', 'completed', 'build_failed', 'failed')
NEW = OLD + ('incomplete', 'interrupted', 'abandoned')


def _status_check(batch, values) -> None:
    batch.drop_constraint(op.f('ck_runs_run_status'), type_='check')
    batch.create_check_constraint(op.f('ck_runs_run_status'), sa.column('status').in_(values))


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('host', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('pid', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('process_started_at', sa.Float(), nullable=True))
        batch.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
        _status_check(batch, NEW)


def downgrade() -> None:
    op.execute("UPDATE runs SET status = 'failed' WHERE status IN ('incomplete', 'interrupted', 'abandoned')")
    with op.batch_alter_table('runs') as batch:
        _status_check(batch, OLD)
        for column in ('heartbeat_at', 'process_started_at', 'pid', 'host'):
            batch.drop_column(column)
