"""Builds keep their metrics: clean or incremental, steps compiled, ccache hit rate.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 12:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('builds.metrics: the build metrics of these builds',
     'SELECT COUNT(*) FROM builds WHERE metrics IS NOT NULL'),
)


def upgrade() -> None:
    op.add_column('builds', sa.Column('metrics', sa.JSON(), nullable=True))


def downgrade() -> None:
    # batch mode: SQLite drops columns by rebuilding the table
    with op.batch_alter_table('builds') as batch:
        batch.drop_column('metrics')
