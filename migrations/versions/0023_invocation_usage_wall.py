"""The wall time an invocation's CPU figures cover (``usage_wall_s``): the whole process for a
command workload (its ``wall_s``), the timing batch for a TVM worker, whose import, compile
and load would dilute a change. With it a TVM workload's runs say how contended they were too.
NULL where ``cpu_s`` is (rows before this revision: their figures cover ``wall_s``).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-25 17:15:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes.
DOWNGRADE_LOSES = (
    ("invocations.usage_wall_s: the wall time each invocation's CPU figures cover",
     "SELECT COUNT(*) FROM invocations WHERE usage_wall_s IS NOT NULL"),
)


def upgrade() -> None:
    op.add_column('invocations', sa.Column('usage_wall_s', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('invocations', 'usage_wall_s')
