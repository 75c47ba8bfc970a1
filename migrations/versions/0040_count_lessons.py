"""A workload's counts (samples a process, children a fork server) are learnt from every
trusted run, whatever its verdict; its noise (``process_cv``) still only from `same` ones. A
profile can so exist before any `same` run: ``process_cv`` is NULL until one, and
``lessons`` counts the runs that taught counts (every RECHECK-th takes the workload's own
count again), as ``observations`` counted them when only `same` runs taught.

Revision ID: 0040
Revises: 0039
Create Date: 2026-11-30 20:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0040'
down_revision = '0039'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("noise_profiles learnt from runs that were never `same` (counts only, no noise)",
     "SELECT COUNT(*) FROM noise_profiles WHERE process_cv IS NULL"),
)


def upgrade() -> None:
    with op.batch_alter_table('noise_profiles') as batch:
        batch.alter_column('process_cv', existing_type=sa.Float(), nullable=True)
        batch.add_column(sa.Column('lessons', sa.Integer(), nullable=False, server_default='0'))
    # until now only `same` runs taught counts: each observation was a lesson
    op.execute("UPDATE noise_profiles SET lessons = observations")


def downgrade() -> None:
    op.execute("DELETE FROM noise_profiles WHERE process_cv IS NULL")
    with op.batch_alter_table('noise_profiles') as batch:
        batch.drop_column('lessons')
        batch.alter_column('process_cv', existing_type=sa.Float(), nullable=False)
