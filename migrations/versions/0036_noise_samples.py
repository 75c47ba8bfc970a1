"""A noise profile keeps the samples a process learnt for its workload and device
(``noise_profiles.samples``: the count that reaches an interval's width fastest, from the
variance between processes' fastest of their first n samples against what a process costs;
``samples_reason``: the figures it was chosen from). NULL: none learnt, the workload's own.

Revision ID: 0036
Revises: 0035
Create Date: 2026-11-28 21:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0036'
down_revision = '0035'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("noise_profiles.samples: the samples a process learnt per workload and device",
     "SELECT COUNT(*) FROM noise_profiles WHERE samples IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN (SQLite has it too): no table rebuild for two nullable columns
    op.add_column('noise_profiles', sa.Column('samples', sa.Integer(), nullable=True))
    op.add_column('noise_profiles', sa.Column('samples_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('noise_profiles') as batch:
        batch.drop_column('samples_reason')
        batch.drop_column('samples')
