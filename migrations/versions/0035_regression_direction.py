"""A stored change has a direction (``regressions.direction``): ``slower`` (a regression, every
row before this revision) or ``faster`` (a confirmed improvement, kept where ``[watch] bisect``
names "improvement", so that its cause is bisected like a regression's). A regression the watch
marked fixed names the commit that fixed it (``regressions.fixed_by_commit_id``). The views stay
about regressions: ``regression_history`` lists the ``slower`` rows only and
``latest_status.open_regressions`` counts them only (0019's and 0026's views, with that condition).

Revision ID: 0035
Revises: 0034
Create Date: 2026-11-27 21:00:00
"""
import importlib

from alembic import op
import sqlalchemy as sa


revision = '0035'
down_revision = '0034'
branch_labels = None
depends_on = None

# What downgrade() drops, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("regressions.direction = 'faster': the confirmed improvements (their rows are deleted with their "
     "steps, events and alerts: they would read as regressions)",
     "SELECT COUNT(*) FROM regressions WHERE direction = 'faster'"),
    ("regressions.fixed_by_commit_id: the commits named as fixing regressions",
     "SELECT COUNT(*) FROM regressions WHERE fixed_by_commit_id IS NOT NULL"),
)

_0019 = importlib.import_module("abwatch.migrations.versions.0019_regression_metric")
_0026 = importlib.import_module("abwatch.migrations.versions.0026_triage_fixed")

SLOWER = "r.direction = 'slower'"
REGRESSION_HISTORY = _0019.REGRESSION_HISTORY.rstrip() + f"\nWHERE {SLOWER}\n"


def _views(history: str, slower_only: bool) -> None:
    """regression_history and latest_status (0026's), counting the ``slower`` rows only if ``slower_only``."""
    sqlite = op.get_bind().dialect.name == 'sqlite'
    where = {'w': 'x.workload_id', 'd': 'x.device_id'} if sqlite else {'w': 'w.id', 'd': 'd.id'}
    open_count = _0026._OPEN_COUNT.format(**where, silenced=_0026._listed(_0026.SILENCED))
    if slower_only:
        open_count = open_count[:-1] + f"\n           AND {SLOWER})"
    op.execute(history)
    op.execute((_0026.LATEST_STATUS_SQLITE if sqlite else _0026.LATEST_STATUS_PG).format(open_count=open_count))


def upgrade() -> None:
    assert REGRESSION_HISTORY.count("FROM regressions r") == 1
    op.execute('DROP VIEW latest_status')
    op.execute('DROP VIEW regression_history')
    if op.get_bind().dialect.name == "sqlite":
        # SQLite rebuilds the table; views over it must not be re-checked mid-rename (as in 0014).
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('direction', sa.String(length=8), nullable=False, server_default='slower'))
        batch.create_check_constraint('regression_direction', sa.text("direction IN ('slower', 'faster')"))
        batch.add_column(sa.Column('fixed_by_commit_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(batch.f('fk_regressions_fixed_by_commit_id_commits'), 'commits',
                                 ['fixed_by_commit_id'], ['id'])
    _views(REGRESSION_HISTORY, slower_only=True)


def downgrade() -> None:
    faster = "SELECT id FROM regressions WHERE direction = 'faster'"
    for table in ("bisection_steps", "regression_events", "alert_deliveries", "triage_events"):
        op.execute(f"DELETE FROM {table} WHERE regression_id IN ({faster})")
    op.execute("DELETE FROM regressions WHERE direction = 'faster'")
    op.execute('DROP VIEW latest_status')
    op.execute('DROP VIEW regression_history')
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(batch.f('fk_regressions_fixed_by_commit_id_commits'), type_='foreignkey')
        batch.drop_column('fixed_by_commit_id')
        batch.drop_constraint(op.f('ck_regressions_regression_direction'), type_='check')
        batch.drop_column('direction')
    _views(_0019.REGRESSION_HISTORY, slower_only=False)
