"""Build measurements: what a run measured of its two builds themselves, one row per metric of
the builds (``binary_size``: the size of the build's libraries, each build's own figures kept in
``builds.metrics["binary_size"]``), judged once per run between its control's and treatment's
build. Not a ``measurements`` row (those are of a comparison: one workload) and not a regression
(those are of one workload too; docs/internals.md, "Metrics of the build").

From this revision on, ``comparisons.details`` no longer repeats the compile-time and instruction
verdicts that the comparison's ``measurements`` rows hold: it keeps what those rows do not (the
instruction profiles, the compile-time regression a run opened). downgrade() writes the verdicts
back into ``details`` from the rows, as the revisions before read them.

Self-contained.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-28 10:00:00
"""
import json

from alembic import op
import sqlalchemy as sa


revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None

DOWNGRADE_LOSES = (
    ("build_measurements: the binary-size verdicts of runs (each build's sizes stay in builds.metrics)",
     "SELECT COUNT(*) FROM build_measurements"),
)

OUTCOMES = ('regression', 'improvement', 'same', 'unknown')


def upgrade() -> None:
    op.create_table(
        'build_measurements',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('metric', sa.String(16), nullable=False),
        sa.Column('unit', sa.String(16), nullable=False),
        sa.Column('verdict', sa.String(32), nullable=False),
        sa.Column('change_pct', sa.Float(), nullable=True),
        sa.Column('control_build_id', sa.Integer(), nullable=False),
        sa.Column('treatment_build_id', sa.Integer(), nullable=False),
        sa.Column('control_value', sa.Float(), nullable=True),
        sa.Column('treatment_value', sa.Float(), nullable=True),
        sa.Column('source', sa.String(32), nullable=True),
        sa.Column('failure', sa.Text(), nullable=True),
        sa.Column('judged', sa.JSON(), nullable=False),
        sa.CheckConstraint(f"verdict IN ({', '.join(repr(v) for v in OUTCOMES)})",
                           name=op.f('ck_build_measurements_verdict')),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_build_measurements_run_id_runs'),
                                ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['control_build_id'], ['builds.id'],
                                name=op.f('fk_build_measurements_control_build_id_builds')),
        sa.ForeignKeyConstraint(['treatment_build_id'], ['builds.id'],
                                name=op.f('fk_build_measurements_treatment_build_id_builds')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_build_measurements')),
        sa.UniqueConstraint('run_id', 'metric', name=op.f('uq_build_measurements_run_id')),
    )


# details key -> (phase, metric, the keys of each side's values) of the rows it was written from
KEYS = {'compile': ('compile-time', 'time', ('control_ms', 'treatment_ms')),
        'instructions': ('runtime', 'instructions', ('control_counts', 'treatment_counts')),
        'compile_instructions': ('compile-time', 'instructions', ('control_counts', 'treatment_counts'))}


def _loads(value):
    return json.loads(value) if isinstance(value, str) else value


def downgrade() -> None:
    op.drop_table('build_measurements')
    bind = op.get_bind()
    found = bind.execute(sa.text(
        "SELECT c.id, c.details, m.phase, m.metric, m.judged, m.control_values, m.treatment_values, m.source, "
        "m.failure FROM comparisons c JOIN measurements m ON m.comparison_id = c.id "
        "WHERE (m.phase = 'compile-time' AND m.metric IN ('time', 'instructions')) "
        "OR (m.phase = 'runtime' AND m.metric = 'instructions') ORDER BY c.id"))
    details: dict[int, dict] = {}
    for cid, stored, phase, metric, judged, control, treatment, source, failure in found:
        d = details.setdefault(cid, dict(_loads(stored) or {}))
        key = next(k for k, (p, m, _) in KEYS.items() if (p, m) == (phase, metric))
        if key == 'compile' and 'compile_ms' not in d:
            continue  # before 0029 only a TVM comparison's details had its compile
        kept = d.get(key) if isinstance(d.get(key), dict) else {}
        if kept.get('verdict'):
            continue  # written before 0029: whole already
        control, treatment = _loads(control) or [], _loads(treatment) or []
        values = KEYS[key][2]
        whole = {**(_loads(judged) or {}), 'n': [len(control), len(treatment)], 'failure': failure}
        if metric == 'instructions':
            whole = {**whole, 'source': source, values[0]: [int(v) for v in control],
                     values[1]: [int(v) for v in treatment]}
        else:
            whole = {**whole, values[0]: control, values[1]: treatment}
        d[key] = {**whole, **kept}  # the profile and the regression a run opened stay
    for cid, d in details.items():
        bind.execute(sa.text("UPDATE comparisons SET details = :d WHERE id = :id"),
                     {"d": json.dumps(d), "id": cid})
