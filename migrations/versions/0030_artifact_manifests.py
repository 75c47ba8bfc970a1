"""The shared artifact store's manifests: one row per artifact pushed to ``[artifacts] store``.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-26 04:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("artifact_manifests: what the shared store holds of each artifact (hosts build again instead of fetching)",
     "SELECT COUNT(*) FROM artifact_manifests"),
)


def upgrade() -> None:
    op.create_table(
        'artifact_manifests',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('artifact_key', sa.String(length=128), nullable=False),
        sa.Column('build_id', sa.Integer(), nullable=True),
        sa.Column('builder', sa.String(length=64), nullable=False),
        sa.Column('sha', sa.String(length=64), nullable=False),
        sa.Column('manifest', sa.JSON(), nullable=False),
        sa.Column('objects', sa.Integer(), nullable=False),
        sa.Column('size_bytes', sa.BigInteger(), nullable=False),
        sa.Column('store', sa.String(length=1024), nullable=False),
        sa.Column('host', sa.String(length=256), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['build_id'], ['builds.id'], name=op.f('fk_artifact_manifests_build_id_builds')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_artifact_manifests')),
        sa.UniqueConstraint('artifact_key', name=op.f('uq_artifact_manifests_artifact_key')),
    )
    op.create_index(op.f('ix_artifact_manifests_build_id'), 'artifact_manifests', ['build_id'])


def downgrade() -> None:
    op.drop_index(op.f('ix_artifact_manifests_build_id'), table_name='artifact_manifests')
    op.drop_table('artifact_manifests')
