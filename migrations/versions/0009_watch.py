"""The watch: progress per branch/device/config, watched commits, a jobs queue, bisection steps;
regressions get a culprit, a group and the state 'fixed'.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 08:45:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('regressions.state: these fixed regressions become open (regress) again',
     "SELECT COUNT(*) FROM regressions WHERE state = 'fixed'"),
    ('regressions.culprit_commit_id: the culprits bisection named',
     'SELECT COUNT(*) FROM regressions WHERE culprit_commit_id IS NOT NULL'),
    ('bisection_steps: stored bisection steps',
     'SELECT COUNT(*) FROM bisection_steps'),
    ("watched_commits: the watch's tested commits",
     'SELECT COUNT(*) FROM watched_commits'),
    ('watch_progress: what each watch has seen',
     'SELECT COUNT(*) FROM watch_progress'),
    ('jobs: queued and finished jobs',
     'SELECT COUNT(*) FROM jobs'),
)

OLD_STATES = ("benchmark", "verify", "regress", "cleared")
NEW_STATES = OLD_STATES + ("fixed",)
# (table, CHECK name, column) of every column that holds a regression state
STATE_CHECKS = (("regressions", "regression_state", "state"),
                ("regression_events", "regression_event_from", "from_state"),
                ("regression_events", "regression_event_to", "to_state"))


def _states(states: tuple[str, ...]) -> None:
    """Re-create the CHECK constraints of the state columns with ``states``."""
    if op.get_bind().dialect.name == "sqlite":
        # SQLite rebuilds the tables; views over them must not be re-checked mid-rename.
        op.execute("PRAGMA legacy_alter_table=ON")
    listed = ", ".join(f"'{s}'" for s in states)
    for table, name, column in STATE_CHECKS:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"ck_{table}_{name}"), type_="check")
            batch.create_check_constraint(name, sa.text(f"{column} IN ({listed})"))


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('device', sa.String(length=256), nullable=False),
    sa.Column('status', sa.Enum('queued', 'running', 'done', 'failed', name='job_status', native_enum=False, create_constraint=True, length=32), nullable=False),
    sa.Column('dedupe_key', sa.String(length=512), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=256), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('dedupe_key', name=op.f('uq_jobs_dedupe_key'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_device'), ['device'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)

    op.create_table('watch_progress',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository_id', sa.Integer(), nullable=False),
    sa.Column('branch', sa.String(length=256), nullable=False),
    sa.Column('device', sa.String(length=256), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('last_seen_sha', sa.String(length=64), nullable=True),
    sa.Column('last_tested_sha', sa.String(length=64), nullable=True),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repository_id'], ['repositories.id'], name=op.f('fk_watch_progress_repository_id_repositories')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_watch_progress')),
    sa.UniqueConstraint('repository_id', 'branch', 'device', 'config_hash', name=op.f('uq_watch_progress_repository_id'))
    )
    op.create_table('watched_commits',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('progress_id', sa.Integer(), nullable=False),
    sa.Column('commit_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('control_sha', sa.String(length=64), nullable=True),
    sa.Column('tested_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['commit_id'], ['commits.id'], name=op.f('fk_watched_commits_commit_id_commits')),
    sa.ForeignKeyConstraint(['progress_id'], ['watch_progress.id'], name=op.f('fk_watched_commits_progress_id_watch_progress')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_watched_commits_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_watched_commits')),
    sa.UniqueConstraint('progress_id', 'commit_id', name=op.f('uq_watched_commits_progress_id'))
    )
    with op.batch_alter_table('watched_commits', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_watched_commits_progress_id'), ['progress_id'], unique=False)

    op.create_table('bisection_steps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('regression_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('commit_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('verdict', sa.String(length=32), nullable=False),
    sa.Column('change_pct', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['commit_id'], ['commits.id'], name=op.f('fk_bisection_steps_commit_id_commits')),
    sa.ForeignKeyConstraint(['regression_id'], ['regressions.id'], name=op.f('fk_bisection_steps_regression_id_regressions')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_bisection_steps_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_bisection_steps'))
    )
    with op.batch_alter_table('bisection_steps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bisection_steps_regression_id'), ['regression_id'], unique=False)

    with op.batch_alter_table('regressions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('culprit_commit_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('group_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_regressions_group_id'), ['group_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_regressions_culprit_commit_id_commits'), 'commits', ['culprit_commit_id'], ['id'])
    _states(NEW_STATES)



def downgrade() -> None:
    op.execute("UPDATE regressions SET state = 'regress' WHERE state = 'fixed'")
    op.execute("UPDATE regression_events SET to_state = 'regress' WHERE to_state = 'fixed'")
    op.execute("UPDATE regression_events SET from_state = 'regress' WHERE from_state = 'fixed'")
    _states(OLD_STATES)
    with op.batch_alter_table('regressions', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_regressions_culprit_commit_id_commits'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_regressions_group_id'))
        batch_op.drop_column('group_id')
        batch_op.drop_column('culprit_commit_id')

    with op.batch_alter_table('bisection_steps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bisection_steps_regression_id'))

    op.drop_table('bisection_steps')
    with op.batch_alter_table('watched_commits', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_watched_commits_progress_id'))

    op.drop_table('watched_commits')
    op.drop_table('watch_progress')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status'))
        batch_op.drop_index(batch_op.f('ix_jobs_device'))

    op.drop_table('jobs')
