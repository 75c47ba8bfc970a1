"""A noise profile keeps the children a fork server learnt for its workload and device
(``noise_profiles.children``: the count that reaches an interval's width fastest, from the
servers' share of the processes' variance against what a server's start and a child cost;
``children_reason``: the figures it was chosen from). NULL: none learnt, the runner's.

Revision ID: 0037
Revises: 0036
Create Date: 2026-11-29 11:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0037'
down_revision = '0036'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("noise_profiles.children: the children a fork server learnt per workload and device",
     "SELECT COUNT(*) FROM noise_profiles WHERE children IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN (SQLite has it too): no table rebuild for two nullable columns
    op.add_column('noise_profiles', sa.Column('children', sa.Integer(), nullable=True))
    op.add_column('noise_profiles', sa.Column('children_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('noise_profiles') as batch:
        batch.drop_column('children_reason')
        batch.drop_column('children')
