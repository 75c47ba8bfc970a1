"""A watched commit's status is an enum with a CHECK: queued, baseline, ok, build_failed, failed, skipped.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24 01:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

STATUSES = ("queued", "baseline", "ok", "build_failed", "failed", "skipped")


def upgrade() -> None:
    listed = ", ".join(f"'{s}'" for s in STATUSES)
    bad = op.get_bind().execute(sa.text(
        f"SELECT DISTINCT status FROM watched_commits WHERE status NOT IN ({listed})")).scalars().all()
    if bad:  # never written by abwatch; a hand-made row must be mended before the CHECK can hold
        raise RuntimeError(f"watched_commits.status holds {sorted(bad)}; expected one of {STATUSES}")
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")  # views are not re-checked mid-rebuild (as in 0009)
    with op.batch_alter_table('watched_commits') as batch:
        batch.create_check_constraint('watched_commit_status', sa.text(f"status IN ({listed})"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('watched_commits') as batch:
        batch.drop_constraint(op.f('ck_watched_commits_watched_commit_status'), type_='check')
