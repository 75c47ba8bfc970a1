"""The trend on the verdict's scale: each comparison keeps both sides' processes by their fastest
sample (``control_fastest_ms``, ``treatment_fastest_ms``: the median of the processes' minima),
and ``workload_series`` gives it as ``fastest_ms`` beside ``median_ms``.

A series of plain medians counted pre-empted samples: a +10 % step read 2.92, 2.90, 5.05,
3.23 ms on a busy machine, where the verdicts (judged on each process's fastest sample) said
+10 %. Rows measured before this revision have no fastest figure (NULL); readers fall back
to their median.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24 07:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('comparisons.control_fastest_ms / treatment_fastest_ms: the fastest-sample figures',
     'SELECT COUNT(*) FROM comparisons WHERE control_fastest_ms IS NOT NULL OR treatment_fastest_ms IS NOT NULL'),
)

WORKLOAD_SERIES = """
CREATE VIEW workload_series AS
SELECT workload, device, sha, summary, committed_at, run_id, side, median_ms, fastest_ms, n, verdict,
       change_pct, ci_low_pct, ci_high_pct, measured_at, workload_id, device_id, commit_id,
       repository, spec_hash
FROM (
  SELECT s.*, ROW_NUMBER() OVER (
           PARTITION BY s.workload_id, s.workload, s.repository, s.spec_hash, s.device, s.commit_id
           ORDER BY s.measured_at DESC, s.run_id DESC, s.side_rank) AS pick
  FROM (
    SELECT w.name AS workload, d.name AS device, cm.sha AS sha, cm.summary AS summary,
           cm.committed_at AS committed_at, ru.id AS run_id, 'treatment' AS side, 0 AS side_rank,
           c.treatment_median_ms AS median_ms, c.treatment_fastest_ms AS fastest_ms,
           c.treatment_n AS n, c.verdict AS verdict,
           c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct, c.ci_high_pct AS ci_high_pct,
           ru.started_at AS measured_at, c.workload_id AS workload_id, ru.device_id AS device_id,
           cm.id AS commit_id, rp.url AS repository, w.spec_hash AS spec_hash
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    JOIN repositories rp ON rp.id = w.repository_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.treatment_commit_id
    WHERE ru.status = 'completed' AND c.treatment_median_ms IS NOT NULL
    UNION ALL
    SELECT w.name, d.name, cm.sha, cm.summary, cm.committed_at, ru.id, 'control', 1,
           c.control_median_ms, c.control_fastest_ms, c.control_n, NULL, NULL, NULL, NULL,
           ru.started_at, c.workload_id, ru.device_id, cm.id, rp.url, w.spec_hash
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    JOIN repositories rp ON rp.id = w.repository_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.control_commit_id
    WHERE ru.status = 'completed' AND c.control_median_ms IS NOT NULL
  ) s
) p
WHERE p.pick = 1
"""

WORKLOAD_SERIES_0010 = """
CREATE VIEW workload_series AS
SELECT workload, device, sha, summary, committed_at, run_id, side, median_ms, n, verdict,
       change_pct, ci_low_pct, ci_high_pct, measured_at, workload_id, device_id, commit_id,
       repository, spec_hash
FROM (
  SELECT s.*, ROW_NUMBER() OVER (
           PARTITION BY s.workload_id, s.workload, s.repository, s.spec_hash, s.device, s.commit_id
           ORDER BY s.measured_at DESC, s.run_id DESC, s.side_rank) AS pick
  FROM (
    SELECT w.name AS workload, d.name AS device, cm.sha AS sha, cm.summary AS summary,
           cm.committed_at AS committed_at, ru.id AS run_id, 'treatment' AS side, 0 AS side_rank,
           c.treatment_median_ms AS median_ms, c.treatment_n AS n, c.verdict AS verdict,
           c.change_pct AS change_pct, c.ci_low_pct AS ci_low_pct, c.ci_high_pct AS ci_high_pct,
           ru.started_at AS measured_at, c.workload_id AS workload_id, ru.device_id AS device_id,
           cm.id AS commit_id, rp.url AS repository, w.spec_hash AS spec_hash
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    JOIN repositories rp ON rp.id = w.repository_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.treatment_commit_id
    WHERE ru.status = 'completed' AND c.treatment_median_ms IS NOT NULL
    UNION ALL
    SELECT w.name, d.name, cm.sha, cm.summary, cm.committed_at, ru.id, 'control', 1,
           c.control_median_ms, c.control_n, NULL, NULL, NULL, NULL,
           ru.started_at, c.workload_id, ru.device_id, cm.id, rp.url, w.spec_hash
    FROM comparisons c
    JOIN runs ru ON ru.id = c.run_id
    JOIN workloads w ON w.id = c.workload_id
    JOIN repositories rp ON rp.id = w.repository_id
    LEFT JOIN devices d ON d.id = ru.device_id
    JOIN commits cm ON cm.id = ru.control_commit_id
    WHERE ru.status = 'completed' AND c.control_median_ms IS NOT NULL
  ) s
) p
WHERE p.pick = 1
"""


def upgrade() -> None:
    op.execute('DROP VIEW workload_series')
    # plain ADD COLUMN on both databases: no table rebuild under the other views
    op.add_column('comparisons', sa.Column('control_fastest_ms', sa.Float(), nullable=True))
    op.add_column('comparisons', sa.Column('treatment_fastest_ms', sa.Float(), nullable=True))
    op.execute(WORKLOAD_SERIES)


def downgrade() -> None:
    op.execute('DROP VIEW workload_series')
    op.execute(WORKLOAD_SERIES_0010)
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")  # views are not re-checked mid-rebuild (as in 0009)
    with op.batch_alter_table('comparisons') as batch:
        batch.drop_column('treatment_fastest_ms')
        batch.drop_column('control_fastest_ms')
