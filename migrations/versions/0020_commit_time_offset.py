"""A commit's time is stored faithfully on both databases: ``commits.committed_at`` holds the
instant in UTC (before 1970 too) and ``commits.committed_offset_min`` the committer's UTC
offset in minutes, which git accepts up to +-99:59 and PostgreSQL's ``timestamptz`` refuses
past 15:59 (a +23:00 commit once stopped a bisection with a DataError).

Existing rows keep their times; their offset is unknown (NULL) until the commit is met again,
when it is filled in from git (``service.store.rows.get_commit``).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25 13:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes.
DOWNGRADE_LOSES = (
    ("commits.committed_offset_min: the committer's time zone of these commits",
     "SELECT COUNT(*) FROM commits WHERE committed_offset_min IS NOT NULL"),
)


def upgrade() -> None:
    with op.batch_alter_table('commits') as batch:
        batch.add_column(sa.Column('committed_offset_min', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('commits') as batch:
        batch.drop_column('committed_offset_min')
