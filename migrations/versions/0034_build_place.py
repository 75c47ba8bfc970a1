"""Where a build was made: ``builds.place`` (``host:cache_dir``).

A successful build was one row per artifact key, whoever found the artifact: a second host or a
second cache directory that built the same commit again was shown the first one's row (its
time, ``cached``). Now each place that builds an artifact has its own row: its own build time,
and ``cached`` only when that place's cache served it; a place that reused another's artifact
(fetched from the artifact store) points at that build's row and says so. NULL place for the
rows before this revision.

Revision ID: 0034
Revises: 0033
Create Date: 2026-11-27 20:45:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0034'
down_revision = '0033'
branch_labels = None
depends_on = None

SUCCESS = "status = 'success'"

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes.
DOWNGRADE_LOSES = (
    ("builds: the rows of a place's own build of an artifact another place built too (runs point at the first)",
     "SELECT COUNT(*) FROM builds b WHERE b.status = 'success' AND b.artifact_key IS NOT NULL AND EXISTS "
     "(SELECT 1 FROM builds o WHERE o.artifact_key = b.artifact_key AND o.status = 'success' AND o.id < b.id)"),
)


def upgrade() -> None:
    op.drop_index('uq_builds_artifact_key_success', table_name='builds')
    with op.batch_alter_table('builds') as batch:
        batch.add_column(sa.Column('place', sa.String(length=400), nullable=True))
    op.create_index('uq_builds_artifact_key_place_success', 'builds', ['artifact_key', 'place'], unique=True,
                    postgresql_where=sa.text(SUCCESS), sqlite_where=sa.text(SUCCESS))


def downgrade() -> None:
    """Back to one row per artifact key: every other success row of a key folds into its lowest id."""
    bind = op.get_bind()
    op.drop_index('uq_builds_artifact_key_place_success', table_name='builds')
    pairs = bind.execute(sa.text(
        "SELECT b.id, k.keep FROM builds b JOIN (SELECT artifact_key, MIN(id) AS keep FROM builds "
        "WHERE status = 'success' AND artifact_key IS NOT NULL GROUP BY artifact_key HAVING COUNT(*) > 1) k "
        "ON k.artifact_key = b.artifact_key WHERE b.status = 'success' AND b.id <> k.keep")).all()
    for duplicate, keep in pairs:
        for table, column in (('runs', 'control_build_id'), ('runs', 'treatment_build_id'),
                              ('build_measurements', 'control_build_id'),
                              ('build_measurements', 'treatment_build_id'), ('artifact_manifests', 'build_id')):
            bind.execute(sa.text(f'UPDATE {table} SET {column} = :keep WHERE {column} = :dup'),
                         {'keep': keep, 'dup': duplicate})
        bind.execute(sa.text('DELETE FROM builds WHERE id = :id'), {'id': duplicate})
    with op.batch_alter_table('builds') as batch:
        batch.drop_column('place')
    op.create_index('uq_builds_artifact_key_success', 'builds', ['artifact_key'], unique=True,
                    postgresql_where=sa.text(SUCCESS), sqlite_where=sa.text(SUCCESS))
