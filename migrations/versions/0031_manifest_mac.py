"""The artifact manifests' MAC: a manifest is used only when authenticated with the fleet's key.

Rows written before this have none: hosts build those artifacts again and sign their manifests.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-27 04:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("artifact_manifests.mac: the manifests' authentication (a later upgrade makes hosts build them again)",
     "SELECT COUNT(*) FROM artifact_manifests WHERE mac IS NOT NULL"),
)


def upgrade() -> None:
    with op.batch_alter_table('artifact_manifests') as batch:
        batch.add_column(sa.Column('mac', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('artifact_manifests') as batch:
        batch.drop_column('mac')
