"""Regressions get a kind: speed or correctness.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 12:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('regressions.kind: these compile-time and correctness regressions become plain ones',
     "SELECT COUNT(*) FROM regressions WHERE kind NOT IN ('runtime', 'speed')"),
)


def upgrade() -> None:
    op.add_column('regressions', sa.Column('kind', sa.String(length=16), server_default='speed', nullable=False))


def downgrade() -> None:
    # batch mode: SQLite drops columns by rebuilding the table
    with op.batch_alter_table('regressions') as batch:
        batch.drop_column('kind')
