"""Bisection into a submodule bump: a build of a commit with a submodule moved to another commit
(``builds.submodule_pin``, ``path@sha``), the submodule commit each step built
(``bisection_steps.submodule_commit_id``) and the submodule commit named as a regression's
culprit with its path (``regressions.culprit_submodule_path``, ``culprit_submodule_commit_id``).
All nullable: rows written before stay as they were.

Self-contained.

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-27 17:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("builds.submodule_pin: which builds had a submodule moved (their rows stay, as plain builds)",
     "SELECT COUNT(*) FROM builds WHERE submodule_pin IS NOT NULL"),
    ("bisection_steps.submodule_commit_id: the submodule commit of steps into a bump",
     "SELECT COUNT(*) FROM bisection_steps WHERE submodule_commit_id IS NOT NULL"),
    ("regressions.culprit_submodule_*: the submodule commits named as culprits",
     "SELECT COUNT(*) FROM regressions WHERE culprit_submodule_commit_id IS NOT NULL"),
)


def upgrade() -> None:
    with op.batch_alter_table('builds') as batch:
        batch.add_column(sa.Column('submodule_pin', sa.String(length=300), nullable=True))
    with op.batch_alter_table('bisection_steps') as batch:
        batch.add_column(sa.Column('submodule_commit_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(batch.f('fk_bisection_steps_submodule_commit_id_commits'), 'commits', ['submodule_commit_id'], ['id'])
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('culprit_submodule_path', sa.String(length=256), nullable=True))
        batch.add_column(sa.Column('culprit_submodule_commit_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(batch.f('fk_regressions_culprit_submodule_commit_id_commits'), 'commits',
                                 ['culprit_submodule_commit_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(batch.f('fk_regressions_culprit_submodule_commit_id_commits'), type_='foreignkey')
        batch.drop_column('culprit_submodule_commit_id')
        batch.drop_column('culprit_submodule_path')
    with op.batch_alter_table('bisection_steps') as batch:
        batch.drop_constraint(batch.f('fk_bisection_steps_submodule_commit_id_commits'), type_='foreignkey')
        batch.drop_column('submodule_commit_id')
    with op.batch_alter_table('builds') as batch:
        batch.drop_column('submodule_pin')
