"""Each raw sample keeps its own CPU time where the worker marked it (``samples.cpu_ms``:
TVM workers on the host CPU, samples of 5 ms or more): under heavy contention a verdict is
judged on the mean of each process's samples in CPU time, and a run's samples a process are
learnt from them. NULL: not measured (a short sample, a command workload, a GPU, a board, an
older TVM, a sample stored before).

Revision ID: 0039
Revises: 0038
Create Date: 2026-11-30 16:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0039'
down_revision = '0038'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("samples.cpu_ms: each sample's own CPU time",
     "SELECT COUNT(*) FROM samples WHERE cpu_ms IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN (SQLite has it too): no table rebuild for a nullable column
    op.add_column('samples', sa.Column('cpu_ms', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('samples') as batch:
        batch.drop_column('cpu_ms')
