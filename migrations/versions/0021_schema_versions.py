"""``schema_versions``: which abwatch version first migrated a database to each revision.

An older abwatch that meets a database at a revision it does not know reads the row of that
revision and names the version to install, instead of advising an upgrade it cannot do.
The rows are written by ``migrations/env.py`` after every upgrade (this table's own included).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-25 13:35:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'schema_versions',
        sa.Column('revision', sa.String(length=64), nullable=False),
        sa.Column('abwatch_version', sa.String(length=64), nullable=False),
        sa.Column('migrated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('revision', name=op.f('pk_schema_versions')),
    )


def downgrade() -> None:
    op.drop_table('schema_versions')
