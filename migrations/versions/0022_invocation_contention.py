"""How contended each measured process was: the CPU time it used (``cpu_s``, user + system,
with the descendants it waited for) and how often the kernel took the CPU from it
(``involuntary_switches``), both from ``wait4`` when the process ended. A verdict taken under
heavy contention is judged on CPU time (see docs/statistics.md); these columns keep the
evidence of each process. NULL for rows measured before this revision and for workload kinds
that do not measure them (TVM workers).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-25 13:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

# What downgrade() loses, as `abwatch db downgrade` lists it before asking for --yes.
DOWNGRADE_LOSES = (
    ("invocations.cpu_s, involuntary_switches: how contended these measured processes were",
     "SELECT COUNT(*) FROM invocations WHERE cpu_s IS NOT NULL OR involuntary_switches IS NOT NULL"),
)


def upgrade() -> None:
    # plain ADD COLUMN on both databases: no view reads `invocations`, no table rebuild
    op.add_column('invocations', sa.Column('cpu_s', sa.Float(), nullable=True))
    op.add_column('invocations', sa.Column('involuntary_switches', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # SQLite (3.35+) drops a column in place too; a rebuild would have to carry the samples' foreign key
    op.drop_column('invocations', 'involuntary_switches')
    op.drop_column('invocations', 'cpu_s')
