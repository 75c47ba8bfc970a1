"""When a run's raw samples were pruned (``runs.samples_pruned_at``): ``abwatch db prune`` and the
``[retention]`` policy delete the ``samples`` rows of old runs that opened nothing and keep
everything else (the run, its verdicts, its invocations). NULL: the run's samples are all
there (or it has none, e.g. a failed build); a time: they were deleted then.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes: which runs
# had their samples pruned (the samples themselves are gone either way).
DOWNGRADE_LOSES = (
    ("runs.samples_pruned_at: which runs' raw samples were pruned, and when",
     "SELECT COUNT(*) FROM runs WHERE samples_pruned_at IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN on both databases; no view reads runs.* whole
    op.add_column('runs', sa.Column('samples_pruned_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'samples_pruned_at')
