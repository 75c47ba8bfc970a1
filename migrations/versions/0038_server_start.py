"""An invocation that was its fork server's first child keeps how long that server took to
start (``invocations.server_start_s``, seconds): with servers started ahead of need, the
child's own wall time no longer holds the start, and the children a server are chosen from
what a start costs. NULL: not a server's first child, or a fresh process.

Revision ID: 0038
Revises: 0037
Create Date: 2026-11-30 05:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0038'
down_revision = '0037'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("invocations.server_start_s: how long each fork server took to start",
     "SELECT COUNT(*) FROM invocations WHERE server_start_s IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN (SQLite has it too): no table rebuild for a nullable column
    op.add_column('invocations', sa.Column('server_start_s', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('invocations') as batch:
        batch.drop_column('server_start_s')
