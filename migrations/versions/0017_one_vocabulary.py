"""One vocabulary and the bisected culprit in SQL.

A run-time regression's kind is stored as ``runtime`` (was ``speed``), the word the views and
alerts already used: the CLI, the API, the pages, alerts and SQL now say the same. The
``regression_history`` view names the culprit bisection found (``culprit_sha`` was the end of
the range; the range stays in ``good_sha``/``bad_sha``) and how many steps it took.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24 07:30:00
"""
import importlib

from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# workload_series and latest_status are those of 0010, unchanged; they are dropped and made
# again only because SQLite rebuilds `regressions` (a new CHECK) underneath them.
_0010 = importlib.import_module("abwatch.migrations.versions.0010_workload_identity")

REGRESSION_HISTORY = """
CREATE VIEW regression_history AS
SELECT r.id AS regression_id,
       w.name AS workload,
       d.name AS device,
       r.kind AS kind,
       r.state AS state,
       r.triage AS triage,
       r.change_pct AS change_pct,
       gc.sha AS good_sha,
       bc.sha AS bad_sha,
       cc.sha AS culprit_sha,
       cc.summary AS culprit_summary,
       cc.author AS culprit_author,
       (SELECT COUNT(*) FROM bisection_steps s WHERE s.regression_id = r.id) AS bisection_steps,
       r.run_id AS run_id,
       r.created_at AS opened_at,
       (SELECT MIN(e.at) FROM regression_events e
         WHERE e.regression_id = r.id AND e.to_state = 'regress') AS verified_at,
       CASE WHEN r.state IN ('cleared', 'fixed') THEN
         (SELECT MAX(e.at) FROM regression_events e
           WHERE e.regression_id = r.id AND e.to_state = r.state) END AS closed_at,
       r.updated_at AS updated_at,
       r.workload_id AS workload_id,
       r.device_id AS device_id,
       rp.url AS repository,
       w.spec_hash AS spec_hash
FROM regressions r
JOIN workloads w ON w.id = r.workload_id
JOIN repositories rp ON rp.id = w.repository_id
LEFT JOIN devices d ON d.id = r.device_id
JOIN commits gc ON gc.id = r.control_commit_id
JOIN commits bc ON bc.id = r.treatment_commit_id
LEFT JOIN commits cc ON cc.id = r.culprit_commit_id
"""


def _recreate_views(history: str) -> None:
    sqlite = op.get_bind().dialect.name == 'sqlite'
    op.execute(history)
    op.execute(_0010.WORKLOAD_SERIES)
    op.execute(_0010.LATEST_STATUS_SQLITE if sqlite else _0010.LATEST_STATUS_PG)


def _rekind(old: str, new: str, kinds: tuple[str, ...]) -> None:
    for name in _0010.VIEWS:
        op.execute(f'DROP VIEW {name}')
    listed = ", ".join(f"'{k}'" for k in kinds)
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(op.f('ck_regressions_regression_kind'), type_='check')
    op.get_bind().execute(sa.text("UPDATE regressions SET kind = :new WHERE kind = :old"), {"new": new, "old": old})
    with op.batch_alter_table('regressions') as batch:
        batch.alter_column('kind', existing_type=sa.String(16), server_default=new)
        batch.create_check_constraint('regression_kind', sa.text(f"kind IN ({listed})"))


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    _rekind("speed", "runtime", ("runtime", "compile-time", "correctness"))
    _recreate_views(REGRESSION_HISTORY)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    _rekind("runtime", "speed", ("speed", "compile-time", "correctness"))
    _recreate_views(_0010.REGRESSION_HISTORY)
