"""One identity per workload, and keys that let several processes share one database.

- A workload is (repository, name, spec hash): a name is no longer unique across the
  database. Existing rows are split where they mixed repositories or specs: each run's own
  config says which repository and spec it measured, and its comparisons, invocations,
  samples and regressions move to the row of that identity (the newest identity keeps the
  old row and its noise profile). Workload rows nothing refers to are dropped.
- A pair/workload/device/kind has at most one open regression (benchmark, verify, regress);
  older duplicates are cleared with an event that names the one kept.
- A successful build is stored once per artifact key; duplicate rows are merged.
- Regressions carry a version, checked on every update (two verifies cannot both move one).
- The views gain the workload's repository and spec hash, and workload_series partitions by
  workload id, so no view mixes two repositories or two specs of one name.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 15:00:00
"""
import hashlib
import importlib
import json

from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('workloads: series folded into the oldest of their name (their histories merge)',
     'SELECT COUNT(*) FROM workloads w WHERE w.id <> (SELECT MIN(x.id) FROM workloads x WHERE x.name = w.name)'),
)

OPEN = "state IN ('benchmark', 'verify', 'regress')"
SAMPLES_FK = 'fk_samples_invocation_id_invocations'


# A workload's identity hash as abwatch computed it when this revision was written (a copy, not
# an import: a migration must do the same thing whatever abwatch runs it). Fields that do not
# change what is timed, and empty values, are left out; sha256 of the sorted JSON, 16 hex digits.
# Specs stored before this revision have no `measure` field, so abwatch's later rule for it
# (service.store.rows.workload_spec_hash) gives the same hash for every row seen here.
NOT_IDENTITY = frozenset({'name', 'timeout_s', 'rtol', 'atol'})


def spec_hash(kind: str, spec: dict) -> str:
    """The identity hash of a stored spec, as of this revision."""
    kept = {k: v for k, v in spec.items() if k not in NOT_IDENTITY and v not in (None, {}, [], '')}
    payload = {'kind': kind, **kept}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _runs_config_spec(config, name):
    for entry in (config or {}).get('workloads') or []:
        if isinstance(entry, dict) and entry.get('name') == name:
            return entry
    return None


def _split_workloads(bind) -> None:
    """Give every (repository, name, spec) its own workload row and move the rows that measured it."""
    def rows(sql, **params):
        return bind.execute(sa.text(sql), params).all()

    def as_json(value):
        return json.loads(value) if isinstance(value, str) else (value or {})

    workloads = {w.id: (w.name, w.kind, as_json(w.spec)) for w in rows('SELECT id, name, kind, spec FROM workloads')}
    runs = {r.id: (r.repository_id, as_json(r.config)) for r in rows('SELECT id, repository_id, config FROM runs')}
    used: dict[int, set[int]] = {}
    for table in ('comparisons', 'invocations', 'regressions'):
        for run_id, workload_id in rows(f'SELECT DISTINCT run_id, workload_id FROM {table}'):
            used.setdefault(workload_id, set()).add(run_id)
    moves = []  # (old workload id, new workload id, run ids)
    for workload_id, (name, kind, spec) in workloads.items():
        run_ids = used.get(workload_id)
        if not run_ids:
            continue
        identities: dict[tuple[int, str], tuple[dict, list[int]]] = {}
        for run_id in sorted(run_ids):
            repository_id, config = runs[run_id]
            run_spec = _runs_config_spec(config, name) or spec
            key = (repository_id, spec_hash(kind, run_spec))
            identities.setdefault(key, (run_spec, []))[1].append(run_id)
        # the identity of the newest run keeps the row (and the noise profile learnt last)
        home = max(identities, key=lambda k: max(identities[k][1]))
        home_spec = identities[home][0]
        bind.execute(sa.text('UPDATE workloads SET repository_id = :r, spec_hash = :h, spec = :s WHERE id = :id'),
                     {'r': home[0], 'h': home[1], 's': json.dumps(home_spec), 'id': workload_id})
        for key, (run_spec, key_runs) in identities.items():
            if key == home:
                continue
            new_id = bind.execute(sa.text(
                'INSERT INTO workloads (repository_id, name, spec_hash, kind, spec) '
                'VALUES (:r, :n, :h, :k, :s) RETURNING id'),
                {'r': key[0], 'n': name, 'h': key[1], 'k': kind, 's': json.dumps(run_spec)}).scalar_one()
            moves.append((workload_id, new_id, key_runs))
    orphans = [w for w in workloads if w not in used]
    for workload_id in orphans:  # never measured: nothing refers to it but perhaps a profile
        bind.execute(sa.text('DELETE FROM noise_profiles WHERE workload_id = :id'), {'id': workload_id})
        bind.execute(sa.text('DELETE FROM workloads WHERE id = :id'), {'id': workload_id})
    if not moves:
        return
    postgres = bind.dialect.name == 'postgresql'
    if postgres:  # samples' composite key names the invocation's workload: move both, then check again
        op.drop_constraint(SAMPLES_FK, 'samples', type_='foreignkey')
    for old, new, run_ids in moves:
        for table in ('comparisons', 'invocations', 'samples', 'regressions'):
            bind.execute(sa.text(f'UPDATE {table} SET workload_id = :new WHERE workload_id = :old '
                                 'AND run_id IN :runs').bindparams(sa.bindparam('runs', expanding=True)),
                         {'new': new, 'old': old, 'runs': run_ids})
    if postgres:
        op.create_foreign_key(SAMPLES_FK, 'samples', 'invocations', ['invocation_id', 'run_id', 'workload_id'],
                              ['id', 'run_id', 'workload_id'])


def _close_duplicate_regressions(bind) -> None:
    duplicates = bind.execute(sa.text(
        f'SELECT r.id, r.state, k.keep FROM regressions r JOIN ('
        f'  SELECT workload_id, device_id, control_commit_id, treatment_commit_id, kind, MIN(id) AS keep'
        f'  FROM regressions WHERE {OPEN}'
        f'  GROUP BY workload_id, device_id, control_commit_id, treatment_commit_id, kind HAVING COUNT(*) > 1'
        f') k ON k.workload_id = r.workload_id AND k.device_id = r.device_id'
        f' AND k.control_commit_id = r.control_commit_id AND k.treatment_commit_id = r.treatment_commit_id'
        f' AND k.kind = r.kind WHERE r.{OPEN} AND r.id <> k.keep')).all()
    for regression_id, state, keep in duplicates:
        bind.execute(sa.text("UPDATE regressions SET state = 'cleared', updated_at = CURRENT_TIMESTAMP "
                             "WHERE id = :id"), {'id': regression_id})
        bind.execute(sa.text(
            "INSERT INTO regression_events (regression_id, from_state, to_state, run_id, reason, at) "
            "VALUES (:id, :state, 'cleared', NULL, :reason, CURRENT_TIMESTAMP)"),
            {'id': regression_id, 'state': state,
             'reason': f'duplicate of regression {keep} (the same pair, workload and device); closed by migration 0010'})


def _merge_duplicate_builds(bind) -> None:
    pairs = bind.execute(sa.text(
        "SELECT b.id, k.keep FROM builds b JOIN (SELECT artifact_key, MIN(id) AS keep FROM builds "
        "WHERE status = 'success' AND artifact_key IS NOT NULL GROUP BY artifact_key HAVING COUNT(*) > 1) k "
        "ON k.artifact_key = b.artifact_key WHERE b.status = 'success' AND b.id <> k.keep")).all()
    for duplicate, keep in pairs:
        for column in ('control_build_id', 'treatment_build_id'):
            bind.execute(sa.text(f'UPDATE runs SET {column} = :keep WHERE {column} = :dup'),
                         {'keep': keep, 'dup': duplicate})
        bind.execute(sa.text('DELETE FROM builds WHERE id = :id'), {'id': duplicate})


# The views of 0005/0007, with the workload's repository and spec hash, never mixing two
# workloads of one name. workload_series partitions by the workload's id *and* its names
# (which the id determines), so a filter on either reaches the base tables before the window.
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
       r.device_id AS device_id,
       rp.url AS repository,
       w.spec_hash AS spec_hash
FROM regressions r
JOIN workloads w ON w.id = r.workload_id
JOIN repositories rp ON rp.id = w.repository_id
LEFT JOIN devices d ON d.id = r.device_id
JOIN commits gc ON gc.id = r.control_commit_id
JOIN commits bc ON bc.id = r.treatment_commit_id
"""

WORKLOAD_SERIES = """
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

_OPEN_COUNT = """(SELECT COUNT(*) FROM regressions r
         WHERE r.workload_id = {w} AND r.device_id = {d}
           AND r.state IN ('benchmark', 'verify', 'regress')
           AND (r.triage IS NULL OR r.triage NOT IN ('expected', 'invalid')))"""

LATEST_STATUS_PG = f"""
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary, x.finished_at AS finished_at,
       {_OPEN_COUNT.format(w='w.id', d='d.id')} AS open_regressions,
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

LATEST_STATUS_SQLITE = f"""
CREATE VIEW latest_status AS
SELECT w.name AS workload, d.name AS device, x.run_id AS run_id, x.verdict AS verdict,
       x.change_pct AS change_pct, x.ci_low_pct AS ci_low_pct, x.ci_high_pct AS ci_high_pct,
       x.treatment_median_ms AS median_ms, cm.sha AS sha, cm.summary AS summary,
       x.finished_at AS finished_at,
       {_OPEN_COUNT.format(w='x.workload_id', d='x.device_id')} AS open_regressions,
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

VIEWS = ('latest_status', 'workload_series', 'regression_history')


def _drop_views() -> None:
    for name in VIEWS:
        op.execute(f'DROP VIEW {name}')


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == 'sqlite'
    _drop_views()  # SQLite rebuilds tables in batch mode; views over them must be gone first
    with op.batch_alter_table('workloads') as batch:
        batch.add_column(sa.Column('repository_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('spec_hash', sa.String(length=64), nullable=True))
        batch.drop_constraint('uq_workloads_name', type_='unique')
    _split_workloads(bind)
    with op.batch_alter_table('workloads') as batch:
        batch.alter_column('repository_id', existing_type=sa.Integer(), nullable=False)
        batch.alter_column('spec_hash', existing_type=sa.String(length=64), nullable=False)
        batch.create_unique_constraint(batch.f('uq_workloads_repository_id'), ['repository_id', 'name', 'spec_hash'])
        batch.create_foreign_key(batch.f('fk_workloads_repository_id_repositories'), 'repositories',
                                 ['repository_id'], ['id'])
        batch.create_index(batch.f('ix_workloads_name'), ['name'], unique=False)
    _close_duplicate_regressions(bind)
    with op.batch_alter_table('regressions') as batch:
        batch.add_column(sa.Column('version', sa.Integer(), server_default='1', nullable=False))
    op.create_index('uq_regressions_open', 'regressions',
                    ['workload_id', 'device_id', 'control_commit_id', 'treatment_commit_id', 'kind'],
                    unique=True, postgresql_where=sa.text(OPEN), sqlite_where=sa.text(OPEN))
    _merge_duplicate_builds(bind)
    op.create_index('uq_builds_artifact_key_success', 'builds', ['artifact_key'], unique=True,
                    postgresql_where=sa.text("status = 'success'"), sqlite_where=sa.text("status = 'success'"))
    op.execute(REGRESSION_HISTORY)
    op.execute(WORKLOAD_SERIES)
    op.execute(LATEST_STATUS_SQLITE if sqlite else LATEST_STATUS_PG)


def downgrade() -> None:
    """Back to one row per name: the split rows of a name fold into its lowest id again."""
    bind = op.get_bind()
    _drop_views()
    op.drop_index('uq_builds_artifact_key_success', table_name='builds')
    op.drop_index('uq_regressions_open', table_name='regressions')
    with op.batch_alter_table('regressions') as batch:
        batch.drop_column('version')
    keep = dict(bind.execute(sa.text('SELECT name, MIN(id) FROM workloads GROUP BY name')).all())
    extra = bind.execute(sa.text('SELECT id, name FROM workloads')).all()
    postgres = bind.dialect.name == 'postgresql'
    folded = [(i, keep[n]) for i, n in extra if keep[n] != i]
    if folded and postgres:
        op.drop_constraint(SAMPLES_FK, 'samples', type_='foreignkey')
    for old, new in folded:
        for table in ('comparisons', 'invocations', 'samples', 'regressions', 'noise_profiles'):
            bind.execute(sa.text(f'UPDATE {table} SET workload_id = :new WHERE workload_id = :old'),
                         {'new': new, 'old': old})
        bind.execute(sa.text('DELETE FROM workloads WHERE id = :id'), {'id': old})
    if folded and postgres:
        op.create_foreign_key(SAMPLES_FK, 'samples', 'invocations', ['invocation_id', 'run_id', 'workload_id'],
                              ['id', 'run_id', 'workload_id'])
    # noise profiles of folded rows may now collide on (workload, device): keep the newest
    bind.execute(sa.text('DELETE FROM noise_profiles WHERE id NOT IN (SELECT MAX(id) FROM noise_profiles '
                         'GROUP BY workload_id, device_id)'))
    with op.batch_alter_table('workloads') as batch:
        batch.drop_index(batch.f('ix_workloads_name'))
        batch.drop_constraint(batch.f('fk_workloads_repository_id_repositories'), type_='foreignkey')
        batch.drop_constraint(batch.f('uq_workloads_repository_id'), type_='unique')
        batch.create_unique_constraint('uq_workloads_name', ['name'])
        batch.drop_column('spec_hash')
        batch.drop_column('repository_id')
    previous = importlib.import_module('abwatch.migrations.versions.0007_views_at_scale')
    first = importlib.import_module('abwatch.migrations.versions.0005_views_triage_alerts')
    op.execute(first.REGRESSION_HISTORY)
    op.execute(previous.WORKLOAD_SERIES)
    op.execute(previous.LATEST_STATUS_SQLITE if bind.dialect.name == 'sqlite' else previous.LATEST_STATUS_PG)
