"""The fork server a timed TVM worker was forked from (``[runner] processes = "forked"``): its
number in the runner's sequence of servers, distinct within a run. Children of one server share
its memory layout, so the server is a level of the statistics above the process. NULL for a
fresh process (every row before this revision).

Revision ID: 0033
Revises: 0032
Create Date: 2026-11-27 17:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0033'
down_revision = '0032'
branch_labels = None
depends_on = None

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes.
DOWNGRADE_LOSES = (
    ("invocations.server: the fork server each forked TVM worker came from",
     "SELECT COUNT(*) FROM invocations WHERE server IS NOT NULL"),
)


def upgrade() -> None:
    op.add_column('invocations', sa.Column('server', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('invocations', 'server')
