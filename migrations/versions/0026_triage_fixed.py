"""A triage decision of its own for a regression a later commit fixed: ``fixed``, with the fixing
commit in ``triage_events.fixed_by`` (GitHub's ``@abwatch triage fixed-by <sha>`` recorded it as
``acknowledged`` with a note before). Both triage columns' CHECKs take the new word, and
``latest_status.open_regressions`` leaves out ``fixed`` ones like ``expected`` and ``invalid``
(the regressions that no longer alert).

Self-contained: the CHECKs and the view are written out here, as 0010 made the view (0025 made
it again unchanged).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-26 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("triage 'fixed' and triage_events.fixed_by: these decisions become acknowledged and lose their fixing commit",
     "SELECT COUNT(*) FROM triage_events WHERE status = 'fixed' OR fixed_by IS NOT NULL"),
)

TRIAGE_BEFORE = ('acknowledged', 'expected', 'invalid', 'wontfix')
TRIAGE = (*TRIAGE_BEFORE, 'fixed')
SILENCED_BEFORE = ('expected', 'invalid')
SILENCED = (*SILENCED_BEFORE, 'fixed')

# latest_status as 0010 made it, with the silenced triage words as a parameter
_OPEN_COUNT = """(SELECT COUNT(*) FROM regressions r
         WHERE r.workload_id = {w} AND r.device_id = {d}
           AND r.state IN ('benchmark', 'verify', 'regress')
           AND (r.triage IS NULL OR r.triage NOT IN ({silenced})))"""

LATEST_STATUS_PG = """
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary, x.finished_at AS finished_at,
       {open_count} AS open_regressions,
       w.id AS workload_id, d.id AS device_id, rp.url AS repository, w.spec_hash AS spec_hash
FROM workloads w
JOIN repositories rp ON rp.id = w.repository_id
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

LATEST_STATUS_SQLITE = """
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.treatment_median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary,
       x.finished_at AS finished_at,
       {open_count} AS open_regressions,
       x.workload_id AS workload_id, x.device_id AS device_id, rp.url AS repository,
       w.spec_hash AS spec_hash
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
JOIN repositories rp ON rp.id = w.repository_id
JOIN devices d ON d.id = x.device_id
JOIN commits cm ON cm.id = x.commit_id
WHERE x.pick = 1
"""


def _listed(words: tuple[str, ...]) -> str:
    return ", ".join(f"'{w}'" for w in words)


def _latest_status(silenced: tuple[str, ...]) -> None:
    sqlite = op.get_bind().dialect.name == 'sqlite'
    where = {'w': 'x.workload_id', 'd': 'x.device_id'} if sqlite else {'w': 'w.id', 'd': 'd.id'}
    open_count = _OPEN_COUNT.format(**where, silenced=_listed(silenced))
    op.execute((LATEST_STATUS_SQLITE if sqlite else LATEST_STATUS_PG).format(open_count=open_count))


def _checks(words: tuple[str, ...]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        # SQLite rebuilds the tables; the views over them must not be re-checked mid-rename (as in 0014)
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('regressions') as batch:
        batch.drop_constraint(op.f('ck_regressions_triage_status'), type_='check')
        batch.create_check_constraint('triage_status', sa.text(f"triage IN ({_listed(words)})"))
    with op.batch_alter_table('triage_events') as batch:
        batch.drop_constraint(op.f('ck_triage_events_triage_event_status'), type_='check')
        batch.create_check_constraint('triage_event_status', sa.text(f"status IN ({_listed(words)})"))


def upgrade() -> None:
    op.execute('DROP VIEW latest_status')
    _checks(TRIAGE)
    # plain ADD COLUMN on both databases
    op.add_column('triage_events', sa.Column('fixed_by', sa.String(length=40), nullable=True))
    _latest_status(SILENCED)


def downgrade() -> None:
    op.execute('DROP VIEW latest_status')
    # before this revision a fix was an acknowledged regression (GitHub's fixed-by kept the sha in the note)
    op.execute("UPDATE triage_events SET status = 'acknowledged' WHERE status = 'fixed'")
    op.execute("UPDATE regressions SET triage = 'acknowledged' WHERE triage = 'fixed'")
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")  # as in _checks
    with op.batch_alter_table('triage_events') as batch:
        batch.drop_column('fixed_by')
    _checks(TRIAGE_BEFORE)
    _latest_status(SILENCED_BEFORE)
