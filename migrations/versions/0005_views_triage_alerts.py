"""SQL views for people (regression_history, workload_series, latest_status); triage
decisions; alert deliveries; indexes for the series and dashboard queries.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 07:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("triage_events: people's triage decisions",
     'SELECT COUNT(*) FROM triage_events'),
    ('alert_deliveries: alerts sent or pending',
     'SELECT COUNT(*) FROM alert_deliveries'),
)

TRIAGE = ('acknowledged', 'expected', 'invalid', 'wontfix')

# One row per regression. `kind` speaks the user's words (runtime, compile-time,
# correctness). The culprit is the commit bisection named; without a bisection it is the
# range's last commit (the treatment of the run that found it).
REGRESSION_HISTORY = """
CREATE VIEW regression_history AS
SELECT r.id AS regression_id,
       w.name AS workload,
       d.name AS device,
       CASE r.kind WHEN 'speed' THEN 'runtime' ELSE r.kind END AS kind,
       r.state AS state,
       r.triage AS triage,
       r.change_pct AS change_pct,
       gc.sha AS good_sha,
       bc.sha AS bad_sha,
       bc.sha AS culprit_sha,
       bc.summary AS culprit_summary,
       bc.author AS culprit_author,
       r.run_id AS run_id,
       r.created_at AS opened_at,
       (SELECT MIN(e.at) FROM regression_events e
         WHERE e.regression_id = r.id AND e.to_state = 'regress') AS verified_at,
       CASE WHEN r.state IN ('cleared', 'fixed') THEN
         (SELECT MAX(e.at) FROM regression_events e
           WHERE e.regression_id = r.id AND e.to_state = r.state) END AS closed_at,
       r.updated_at AS updated_at,
       r.workload_id AS workload_id,
       r.device_id AS device_id
FROM regressions r
JOIN workloads w ON w.id = r.workload_id
LEFT JOIN devices d ON d.id = r.device_id
JOIN commits gc ON gc.id = r.control_commit_id
JOIN commits bc ON bc.id = r.treatment_commit_id
"""

# One row per commit x workload x device: the newest completed run that measured the
# commit (as treatment, else as control). The change and its CI are against that run's
# control, so they are set only where the commit was the treatment.
WORKLOAD_SERIES = """
CREATE VIEW workload_series AS
SELECT w.name AS workload,
       d.name AS device,
       cm.sha AS sha,
       cm.summary AS summary,
       cm.committed_at AS committed_at,
       p.run_id AS run_id,
       p.side AS side,
       p.median_ms AS median_ms,
       p.n AS n,
       p.verdict AS verdict,
       p.change_pct AS change_pct,
       p.ci_low_pct AS ci_low_pct,
       p.ci_high_pct AS ci_high_pct,
       p.measured_at AS measured_at,
       p.workload_id AS workload_id,
       p.device_id AS device_id,
       p.commit_id AS commit_id
FROM (
  SELECT s.*, ROW_NUMBER() OVER (
           PARTITION BY s.workload_id, s.device_id, s.commit_id
           ORDER BY s.measured_at DESC, s.run_id DESC, s.side_rank) AS pick
  FROM (
    SELECT c.workload_id AS workload_id, ru.device_id AS device_id,
           ru.treatment_commit_id AS commit_id, ru.id AS run_id, 'treatment' AS side,
           0 AS side_rank, c.treatment_median_ms AS median_ms, c.treatment_n AS n,
           c.verdict AS verdict, c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct,
           c.ci_high_pct AS ci_high_pct, ru.started_at AS measured_at
    FROM comparisons c JOIN runs ru ON ru.id = c.run_id
    WHERE ru.status = 'completed' AND c.treatment_median_ms IS NOT NULL
    UNION ALL
    SELECT c.workload_id, ru.device_id, ru.control_commit_id, ru.id, 'control', 1,
           c.control_median_ms, c.control_n, NULL, NULL, NULL, NULL, ru.started_at
    FROM comparisons c JOIN runs ru ON ru.id = c.run_id
    WHERE ru.status = 'completed' AND c.control_median_ms IS NOT NULL
  ) s
) p
JOIN workloads w ON w.id = p.workload_id
LEFT JOIN devices d ON d.id = p.device_id
JOIN commits cm ON cm.id = p.commit_id
WHERE p.pick = 1
"""

# One row per workload x device: its newest completed run's verdict, and how many of its
# regressions are still open.
LATEST_STATUS = """
CREATE VIEW latest_status AS
SELECT w.name AS workload,
       d.name AS device,
       x.run_id AS run_id,
       x.verdict AS verdict,
       x.change_pct AS change_pct,
       x.ci_low_pct AS ci_low_pct,
       x.ci_high_pct AS ci_high_pct,
       x.treatment_median_ms AS median_ms,
       cm.sha AS sha,
       cm.summary AS summary,
       x.finished_at AS finished_at,
       (SELECT COUNT(*) FROM regressions r
         WHERE r.workload_id = x.workload_id AND r.device_id = x.device_id
           AND r.state IN ('benchmark', 'verify', 'regress')) AS open_regressions,
       x.workload_id AS workload_id,
       x.device_id AS device_id
FROM (
  SELECT c.workload_id AS workload_id, ru.device_id AS device_id, ru.id AS run_id,
         c.verdict AS verdict, c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct,
         c.ci_high_pct AS ci_high_pct, c.treatment_median_ms AS treatment_median_ms,
         ru.treatment_commit_id AS commit_id, ru.finished_at AS finished_at,
         ROW_NUMBER() OVER (PARTITION BY c.workload_id, ru.device_id
                            ORDER BY ru.finished_at DESC, ru.id DESC) AS pick
  FROM comparisons c JOIN runs ru ON ru.id = c.run_id
  WHERE ru.status = 'completed'
) x
JOIN workloads w ON w.id = x.workload_id
LEFT JOIN devices d ON d.id = x.device_id
JOIN commits cm ON cm.id = x.commit_id
WHERE x.pick = 1
"""

VIEWS = {'regression_history': REGRESSION_HISTORY, 'workload_series': WORKLOAD_SERIES,
         'latest_status': LATEST_STATUS}


def upgrade() -> None:
    op.create_table('triage_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('regression_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.Enum(*TRIAGE, name='triage_event_status', native_enum=False,
                                create_constraint=True, length=32), nullable=False),
    sa.Column('who', sa.String(length=256), nullable=False),
    sa.Column('issue_url', sa.String(length=1024), nullable=True),
    sa.Column('note', sa.Text(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['regression_id'], ['regressions.id'], name=op.f('fk_triage_events_regression_id_regressions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_triage_events'))
    )
    op.create_index(op.f('ix_triage_events_regression_id'), 'triage_events', ['regression_id'], unique=False)
    op.create_table('alert_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('regression_id', sa.Integer(), nullable=True),
    sa.Column('event', sa.String(length=32), nullable=False),
    sa.Column('url', sa.String(length=1024), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['regression_id'], ['regressions.id'], name=op.f('fk_alert_deliveries_regression_id_regressions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_deliveries'))
    )
    op.create_index(op.f('ix_alert_deliveries_regression_id'), 'alert_deliveries', ['regression_id'], unique=False)
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('triage', sa.Enum(*TRIAGE, name='triage_status', native_enum=False,
                                                     create_constraint=True, length=32), nullable=True))
        batch.create_index(batch.f('ix_regressions_state'), ['state'], unique=False)
        batch.create_index(batch.f('ix_regressions_workload_id'), ['workload_id'], unique=False)
    op.create_index(op.f('ix_comparisons_workload_id'), 'comparisons', ['workload_id'], unique=False)
    op.create_index('ix_runs_device_id_started_at', 'runs', ['device_id', 'started_at'], unique=False)
    for sql in VIEWS.values():
        op.execute(sql)


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f'DROP VIEW {name}')
    op.drop_index('ix_runs_device_id_started_at', table_name='runs')
    op.drop_index(op.f('ix_comparisons_workload_id'), table_name='comparisons')
    # batch mode: SQLite drops columns by rebuilding the table
    with op.batch_alter_table('regressions') as batch:
        batch.drop_index(batch.f('ix_regressions_workload_id'))
        batch.drop_index(batch.f('ix_regressions_state'))
        batch.drop_constraint(op.f('ck_regressions_triage_status'), type_='check')
        batch.drop_column('triage')
    op.drop_index(op.f('ix_alert_deliveries_regression_id'), table_name='alert_deliveries')
    op.drop_table('alert_deliveries')
    op.drop_index(op.f('ix_triage_events_regression_id'), table_name='triage_events')
    op.drop_table('triage_events')
