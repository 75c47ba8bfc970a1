"""Noise profiles per (workload, device); the verdicts behind each regression's state.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 11:28:15.198466
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('noise_profiles: learnt noise of a workload on a device',
     'SELECT COUNT(*) FROM noise_profiles'),
    ('regressions.benchmark_verdict / verify_verdict: the verdicts kept on these regressions',
     'SELECT COUNT(*) FROM regressions WHERE benchmark_verdict IS NOT NULL OR verify_verdict IS NOT NULL'),
)


def upgrade() -> None:
    op.create_table('noise_profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('process_cv', sa.Float(), nullable=False),
    sa.Column('observations', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_noise_profiles_device_id_devices')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_noise_profiles_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_noise_profiles')),
    sa.UniqueConstraint('workload_id', 'device_id', name=op.f('uq_noise_profiles_workload_id'))
    )
    op.add_column('regressions', sa.Column('benchmark_verdict', sa.JSON(), nullable=True))
    op.add_column('regressions', sa.Column('verify_verdict', sa.JSON(), nullable=True))


def downgrade() -> None:
    # batch mode: SQLite drops columns by rebuilding the table
    with op.batch_alter_table('regressions') as batch:
        batch.drop_column('verify_verdict')
        batch.drop_column('benchmark_verdict')
    op.drop_table('noise_profiles')
