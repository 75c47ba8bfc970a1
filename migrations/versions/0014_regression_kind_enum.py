"""Regression kinds are an enum with a CHECK: speed, compile-time, correctness.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24 00:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

KINDS = ("speed", "compile-time", "correctness")


def upgrade() -> None:
    bad = op.get_bind().execute(sa.text(
        "SELECT DISTINCT kind FROM regressions WHERE kind NOT IN ('speed', 'compile-time', 'correctness')")).scalars().all()
    if bad:  # never written by abwatch; a hand-made row must be mended before the CHECK can hold
        raise RuntimeError(f"regressions.kind holds {sorted(bad)}; expected one of {KINDS}")
    if op.get_bind().dialect.name == "sqlite":
        # SQLite rebuilds the table; views over it must not be re-checked mid-rename (as in 0009).
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('regressions') as batch:
        # the column keeps its width (16): PostgreSQL cannot retype a column the views read
        batch.create_check_constraint('regression_kind', sa.text("kind IN ('speed', 'compile-time', 'correctness')"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(op.f('ck_regressions_regression_kind'), type_='check')
