"""Years of nightly data: samples get one composite foreign key (invocation, run,
workload) instead of three, so their bulk write is not slowed by three row triggers. Views that stay fast: workload_series filters by workload name
and device inside its window (PostgreSQL pushes such filters down), latest_status looks up
each (workload, device)'s newest run by index; silenced regressions are not counted open.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 08:00:00
"""
from alembic import op


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

# Partitioned by names, so `WHERE workload = ... AND device = ...` reaches the base tables.
WORKLOAD_SERIES = """
CREATE VIEW workload_series AS
SELECT workload, device, sha, summary, committed_at, run_id, side, median_ms, n, verdict,
       change_pct, ci_low_pct, ci_high_pct, measured_at, workload_id, device_id, commit_id
FROM (
  SELECT s.*, ROW_NUMBER() OVER (
           PARTITION BY s.workload, s.device, s.commit_id
           ORDER BY s.measured_at DESC, s.run_id DESC, s.side_rank) AS pick
  FROM (
    SELECT w.name AS workload, d.name AS device, cm.sha AS sha, cm.summary AS summary,
           cm.committed_at AS committed_at, ru.id AS run_id, 'treatment' AS side, 0 AS side_rank,
           c.treatment_median_ms AS median_ms, c.treatment_n AS n, c.verdict AS verdict,
           c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct, c.ci_high_pct AS ci_high_pct,
           ru.started_at AS measured_at, c.workload_id AS workload_id, ru.device_id AS device_id,
           cm.id AS commit_id
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.treatment_commit_id
    WHERE ru.status = 'completed' AND c.treatment_median_ms IS NOT NULL
    UNION ALL
    SELECT w.name, d.name, cm.sha, cm.summary, cm.committed_at, ru.id, 'control', 1,
           c.control_median_ms, c.control_n, NULL, NULL, NULL, NULL,
           ru.started_at, c.workload_id, ru.device_id, cm.id
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.control_commit_id
    WHERE ru.status = 'completed' AND c.control_median_ms IS NOT NULL
  ) s
) p
WHERE p.pick = 1
"""

OPEN = """(SELECT COUNT(*) FROM regressions r
         WHERE r.workload_id = {w} AND r.device_id = {d}
           AND r.state IN ('benchmark', 'verify', 'regress')
           AND (r.triage IS NULL OR r.triage NOT IN ('expected', 'invalid')))"""

# PostgreSQL: per (workload, device), the newest run by an index walk (LATERAL ... LIMIT 1).
LATEST_STATUS_PG = f"""
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary, x.finished_at AS finished_at,
       {OPEN.format(w='w.id', d='d.id')} AS open_regressions,
       w.id AS workload_id, d.id AS device_id
FROM workloads w
CROSS JOIN devices d
CROSS JOIN LATERAL (
  SELECT ru.id AS run_id, c.verdict AS verdict, c.change_pct AS change_pct,
         c.ci_low_pct AS ci_low_pct, c.ci_high_pct AS ci_high_pct,
         c.treatment_median_ms AS median_ms, ru.treatment_commit_id AS commit_id,
         ru.finished_at AS finished_at
  FROM comparisons c JOIN runs ru ON ru.id = c.run_id
  WHERE c.workload_id = w.id AND ru.device_id = d.id AND ru.status = 'completed'
  ORDER BY c.run_id DESC
  LIMIT 1
) x
JOIN commits cm ON cm.id = x.commit_id
"""

# SQLite has no LATERAL: the same answer from a window.
LATEST_STATUS_SQLITE = f"""
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.treatment_median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary,
       x.finished_at AS finished_at,
       {OPEN.format(w='x.workload_id', d='x.device_id')} AS open_regressions,
       x.workload_id AS workload_id, x.device_id AS device_id
FROM (
  SELECT c.workload_id AS workload_id, ru.device_id AS device_id, ru.id AS run_id,
         c.verdict AS verdict, c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct,
         c.ci_high_pct AS ci_high_pct, c.treatment_median_ms AS treatment_median_ms,
         ru.treatment_commit_id AS commit_id, ru.finished_at AS finished_at,
         ROW_NUMBER() OVER (PARTITION BY c.workload_id, ru.device_id ORDER BY ru.id DESC) AS pick
  FROM comparisons c JOIN runs ru ON ru.id = c.run_id
  WHERE ru.status = 'completed' AND ru.device_id IS NOT NULL
) x
JOIN workloads w ON w.id = x.workload_id
JOIN devices d ON d.id = x.device_id
JOIN commits cm ON cm.id = x.commit_id
WHERE x.pick = 1
"""


def _previous():
    import importlib

    return importlib.import_module('abwatch.migrations.versions.0005_views_triage_alerts')


def upgrade() -> None:
    with op.batch_alter_table('invocations') as batch:
        batch.create_unique_constraint(batch.f('uq_invocations_id'), ['id', 'run_id', 'workload_id'])
    with op.batch_alter_table('samples') as batch:
        batch.drop_constraint(batch.f('fk_samples_workload_id_workloads'), type_='foreignkey')
        batch.drop_constraint(batch.f('fk_samples_run_id_runs'), type_='foreignkey')
        batch.drop_constraint(batch.f('fk_samples_invocation_id_invocations'), type_='foreignkey')
        batch.create_foreign_key(batch.f('fk_samples_invocation_id_invocations'), 'invocations',
                                 ['invocation_id', 'run_id', 'workload_id'], ['id', 'run_id', 'workload_id'])
    op.execute('DROP VIEW latest_status')
    op.execute('DROP VIEW workload_series')
    op.drop_index('ix_comparisons_workload_id', table_name='comparisons')
    # the series' columns ride in the index (PostgreSQL): an index-only scan per workload
    op.create_index('ix_comparisons_workload_id_run_id', 'comparisons', ['workload_id', 'run_id'], unique=False,
                    postgresql_include=['control_median_ms', 'treatment_median_ms', 'control_n', 'treatment_n',
                                        'verdict', 'change_pct', 'ci_low_pct', 'ci_high_pct'])
    op.execute(WORKLOAD_SERIES)
    sqlite = op.get_bind().dialect.name == 'sqlite'
    op.execute(LATEST_STATUS_SQLITE if sqlite else LATEST_STATUS_PG)


def downgrade() -> None:
    op.execute('DROP VIEW latest_status')
    op.execute('DROP VIEW workload_series')
    op.drop_index('ix_comparisons_workload_id_run_id', table_name='comparisons')
    op.create_index('ix_comparisons_workload_id', 'comparisons', ['workload_id'], unique=False)
    previous = _previous()
    op.execute(previous.WORKLOAD_SERIES)
    op.execute(previous.LATEST_STATUS)
    with op.batch_alter_table('samples') as batch:
        batch.drop_constraint(batch.f('fk_samples_invocation_id_invocations'), type_='foreignkey')
        batch.create_foreign_key(batch.f('fk_samples_invocation_id_invocations'), 'invocations',
                                 ['invocation_id'], ['id'])
        batch.create_foreign_key(batch.f('fk_samples_run_id_runs'), 'runs', ['run_id'], ['id'])
        batch.create_foreign_key(batch.f('fk_samples_workload_id_workloads'), 'workloads', ['workload_id'], ['id'])
    with op.batch_alter_table('invocations') as batch:
        batch.drop_constraint(batch.f('uq_invocations_id'), type_='unique')
