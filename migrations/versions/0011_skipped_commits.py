"""A watched commit that could not be read or stored is recorded `skipped`, with its reason.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 00:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('watched_commits.reason: why these commits were skipped',
     'SELECT COUNT(*) FROM watched_commits WHERE reason IS NOT NULL'),
)


def upgrade() -> None:
    with op.batch_alter_table('watched_commits') as batch:
        batch.add_column(sa.Column('reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('watched_commits') as batch:
        batch.drop_column('reason')
