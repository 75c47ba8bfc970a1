"""A forked workload's fork servers' share of its process variance, pooled over its runs
(``server_share``, a running mean over ``server_share_runs`` runs): the children a server are
chosen from it, not from one run's estimate alone. Profiles learnt before have none (NULL, 0).

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-01 03:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0041'
down_revision = '0040'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("noise profiles' pooled fork-server shares (the next children choices start from one run's again)",
     "SELECT COUNT(*) FROM noise_profiles WHERE server_share IS NOT NULL"),
)


def upgrade() -> None:
    with op.batch_alter_table('noise_profiles') as batch:
        batch.add_column(sa.Column('server_share', sa.Float(), nullable=True))
        batch.add_column(sa.Column('server_share_runs', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('noise_profiles') as batch:
        batch.drop_column('server_share_runs')
        batch.drop_column('server_share')
