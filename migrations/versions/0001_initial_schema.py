"""Initial schema: repositories, commits, builds, devices, workloads, runs, samples, verdicts, regressions, records.

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 11:10:38.779472
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('every table: runs',
     'SELECT COUNT(*) FROM runs'),
    ('every table: raw samples',
     'SELECT COUNT(*) FROM samples'),
    ('every table: regressions',
     'SELECT COUNT(*) FROM regressions'),
    ('every table: records',
     'SELECT COUNT(*) FROM records'),
    ('every table: builds',
     'SELECT COUNT(*) FROM builds'),
    ('every table: commits',
     'SELECT COUNT(*) FROM commits'),
)


def upgrade() -> None:
    op.create_table('devices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=256), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('hardware_config', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_devices')),
    sa.UniqueConstraint('name', name=op.f('uq_devices_name'))
    )
    op.create_table('repositories',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('url', sa.String(length=1024), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_repositories')),
    sa.UniqueConstraint('url', name=op.f('uq_repositories_url'))
    )
    op.create_table('workloads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=256), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workloads')),
    sa.UniqueConstraint('name', name=op.f('uq_workloads_name'))
    )
    op.create_table('commits',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.Integer(), nullable=False),
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('author', sa.String(length=256), nullable=False),
    sa.Column('committed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], name=op.f('fk_commits_repository_id_repositories')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_commits')),
    sa.UniqueConstraint('repository_id', 'sha', name=op.f('uq_commits_repository_id'))
    )
    op.create_index(op.f('ix_commits_sha'), 'commits', ['sha'], unique=False)
    op.create_table('builds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('commit_id', sa.Integer(), nullable=False),
    sa.Column('builder', sa.String(length=64), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('status', sa.Enum('success', 'build_failed', name='build_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('artifact_key', sa.String(length=128), nullable=True),
    sa.Column('cached', sa.Boolean(), nullable=False),
    sa.Column('log', sa.Text(), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['commit_id'], ['commits.id'], name=op.f('fk_builds_commit_id_commits')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_builds'))
    )
    op.create_index(op.f('ix_builds_commit_id'), 'builds', ['commit_id'], unique=False)
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_type', sa.Enum('benchmark', 'verify', 'regress', name='run_type', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('status', sa.Enum('running', 'completed', 'build_failed', 'failed', name='run_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('repository_id', sa.Integer(), nullable=False),
    sa.Column('control_ref', sa.String(length=256), nullable=False),
    sa.Column('treatment_ref', sa.String(length=256), nullable=False),
    sa.Column('control_commit_id', sa.Integer(), nullable=False),
    sa.Column('treatment_commit_id', sa.Integer(), nullable=False),
    sa.Column('control_build_id', sa.Integer(), nullable=True),
    sa.Column('treatment_build_id', sa.Integer(), nullable=True),
    sa.Column('device_id', sa.Integer(), nullable=True),
    sa.Column('parent_run_id', sa.Integer(), nullable=True),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['control_build_id'], ['builds.id'], name=op.f('fk_runs_control_build_id_builds')),
    sa.ForeignKeyConstraint(['control_commit_id'], ['commits.id'], name=op.f('fk_runs_control_commit_id_commits')),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_runs_device_id_devices')),
    sa.ForeignKeyConstraint(['parent_run_id'], ['runs.id'], name=op.f('fk_runs_parent_run_id_runs')),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], name=op.f('fk_runs_repository_id_repositories')),
    sa.ForeignKeyConstraint(['treatment_build_id'], ['builds.id'], name=op.f('fk_runs_treatment_build_id_builds')),
    sa.ForeignKeyConstraint(['treatment_commit_id'], ['commits.id'], name=op.f('fk_runs_treatment_commit_id_commits')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    op.create_table('comparisons',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('verdict', sa.Enum('regression', 'improvement', 'same', 'unknown', name='verdict', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('change_pct', sa.Float(), nullable=True),
    sa.Column('ci_low_pct', sa.Float(), nullable=True),
    sa.Column('ci_high_pct', sa.Float(), nullable=True),
    sa.Column('p_value', sa.Float(), nullable=True),
    sa.Column('control_median_ms', sa.Float(), nullable=True),
    sa.Column('treatment_median_ms', sa.Float(), nullable=True),
    sa.Column('control_n', sa.Integer(), nullable=False),
    sa.Column('treatment_n', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_comparisons_run_id_runs')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_comparisons_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_comparisons')),
    sa.UniqueConstraint('run_id', 'workload_id', name=op.f('uq_comparisons_run_id'))
    )
    op.create_index(op.f('ix_comparisons_run_id'), 'comparisons', ['run_id'], unique=False)
    op.create_table('invocations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('side', sa.Enum('control', 'treatment', name='side', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('warmup', sa.Boolean(), nullable=False),
    sa.Column('status', sa.Enum('ok', 'timeout', 'error', name='invocation_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('wall_s', sa.Float(), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_invocations_run_id_runs')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_invocations_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_invocations'))
    )
    op.create_index(op.f('ix_invocations_run_id'), 'invocations', ['run_id'], unique=False)
    op.create_table('records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('side', sa.Enum('control', 'treatment', name='record_side', native_enum=False, create_constraint=True, length=32), nullable=True),
    sa.Column('workload', sa.String(length=256), nullable=False),
    sa.Column('engine', sa.String(length=64), nullable=False),
    sa.Column('engine_version', sa.String(length=128), nullable=True),
    sa.Column('hardware', sa.String(length=256), nullable=False),
    sa.Column('runtime_ms_mean', sa.Float(), nullable=False),
    sa.Column('runtime_ms_std', sa.Float(), nullable=False),
    sa.Column('timestamp', sa.JSON(), nullable=False),
    sa.Column('schema_version', sa.String(length=16), nullable=False),
    sa.Column('fields', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_records_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_records'))
    )
    op.create_index(op.f('ix_records_run_id'), 'records', ['run_id'], unique=False)
    op.create_index(op.f('ix_records_workload'), 'records', ['workload'], unique=False)
    op.create_table('regressions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=True),
    sa.Column('control_commit_id', sa.Integer(), nullable=False),
    sa.Column('treatment_commit_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('comparison_id', sa.Integer(), nullable=False),
    sa.Column('state', sa.Enum('benchmark', 'verify', 'regress', 'cleared', name='regression_state', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('change_pct', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['comparison_id'], ['comparisons.id'], name=op.f('fk_regressions_comparison_id_comparisons')),
    sa.ForeignKeyConstraint(['control_commit_id'], ['commits.id'], name=op.f('fk_regressions_control_commit_id_commits')),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_regressions_device_id_devices')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_regressions_run_id_runs')),
    sa.ForeignKeyConstraint(['treatment_commit_id'], ['commits.id'], name=op.f('fk_regressions_treatment_commit_id_commits')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_regressions_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_regressions'))
    )
    op.create_index(op.f('ix_regressions_run_id'), 'regressions', ['run_id'], unique=False)
    op.create_table('samples',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('invocation_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('side', sa.Enum('control', 'treatment', name='side', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('order_index', sa.Integer(), nullable=False),
    sa.Column('runtime_ms', sa.Float(), nullable=False),
    sa.Column('warmup', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['invocation_id'], ['invocations.id'], name=op.f('fk_samples_invocation_id_invocations')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_samples_run_id_runs')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_samples_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_samples'))
    )
    op.create_index(op.f('ix_samples_invocation_id'), 'samples', ['invocation_id'], unique=False)
    op.create_index(op.f('ix_samples_run_id'), 'samples', ['run_id'], unique=False)
    op.create_table('regression_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('regression_id', sa.Integer(), nullable=False),
    sa.Column('from_state', sa.Enum('benchmark', 'verify', 'regress', 'cleared', name='regression_event_from', native_enum=False, create_constraint=True, length=32), nullable=True),
    sa.Column('to_state', sa.Enum('benchmark', 'verify', 'regress', 'cleared', name='regression_event_to', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['regression_id'], ['regressions.id'], name=op.f('fk_regression_events_regression_id_regressions')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_regression_events_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_regression_events'))
    )
    op.create_index(op.f('ix_regression_events_regression_id'), 'regression_events', ['regression_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_regression_events_regression_id'), table_name='regression_events')
    op.drop_table('regression_events')
    op.drop_index(op.f('ix_samples_run_id'), table_name='samples')
    op.drop_index(op.f('ix_samples_invocation_id'), table_name='samples')
    op.drop_table('samples')
    op.drop_index(op.f('ix_regressions_run_id'), table_name='regressions')
    op.drop_table('regressions')
    op.drop_index(op.f('ix_records_workload'), table_name='records')
    op.drop_index(op.f('ix_records_run_id'), table_name='records')
    op.drop_table('records')
    op.drop_index(op.f('ix_invocations_run_id'), table_name='invocations')
    op.drop_table('invocations')
    op.drop_index(op.f('ix_comparisons_run_id'), table_name='comparisons')
    op.drop_table('comparisons')
    op.drop_table('runs')
    op.drop_index(op.f('ix_builds_commit_id'), table_name='builds')
    op.drop_table('builds')
    op.drop_index(op.f('ix_commits_sha'), table_name='commits')
    op.drop_table('commits')
    op.drop_table('workloads')
    op.drop_table('repositories')
    op.drop_table('devices')
