"""Typed measurements: what a comparison measured per metric is a row of ``measurements``
(phase, metric, unit, verdict, change and interval, each side's values), not keys in
``comparisons.details``. Today's data moves in: the run-time verdict of every comparison
(its values are the samples, in ``samples``), and the compile-time, instructions and
compile-instructions verdicts kept in ``details`` (with their compile times and counts).
Invocations keep their peak resident memory (``max_rss_kb``), and a regression may be opened
by ``cpu_time`` or ``max_rss`` as well as ``time`` and ``instructions``.

Metric names are the metric registry's (``service.compare.metrics.METRICS``), a plug-in
vocabulary: neither ``measurements.metric`` nor ``regressions.metric`` has a CHECK any more
(the application validates them), so a new metric needs no migration.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-25 21:10:00
"""
import importlib
import json

from alembic import op
import sqlalchemy as sa


revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

DOWNGRADE_LOSES = (
    ("measurements: the typed rows of what comparisons measured (time, compile and instruction "
     "verdicts stay in comparisons.details; CPU time and peak memory verdicts are lost)",
     "SELECT COUNT(*) FROM measurements"),
    ("invocations.max_rss_kb: each invocation's peak resident memory",
     "SELECT COUNT(*) FROM invocations WHERE max_rss_kb IS NOT NULL"),
    ("regressions.metric: regressions opened on another metric (CPU time, peak memory) become time ones",
     "SELECT COUNT(*) FROM regressions WHERE metric NOT IN ('time', 'instructions')"),
)

_0010 = importlib.import_module("abwatch.migrations.versions.0010_workload_identity")
_0018 = importlib.import_module("abwatch.migrations.versions.0018_fastest_series")
_0019 = importlib.import_module("abwatch.migrations.versions.0019_regression_metric")

OUTCOMES = ('regression', 'improvement', 'same', 'unknown')
PHASES = ('runtime', 'compile-time')


def _in(column: str, values) -> sa.TextClause:
    return sa.text(f"{column} IN ({', '.join(repr(v) for v in values)})")


def _views() -> None:
    sqlite = op.get_bind().dialect.name == 'sqlite'
    op.execute(_0019.REGRESSION_HISTORY)
    op.execute(_0018.WORKLOAD_SERIES)
    op.execute(_0010.LATEST_STATUS_SQLITE if sqlite else _0010.LATEST_STATUS_PG)


def _metric_check(values) -> None:
    """Drop ``regressions.metric``'s CHECK (``values`` None), or put one back."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    for name in _0010.VIEWS:  # SQLite rebuilds `regressions` underneath them
        op.execute(f'DROP VIEW {name}')
    with op.batch_alter_table('regressions') as batch:
        if values is None:
            batch.drop_constraint(op.f('ck_regressions_metric'), type_='check')
        else:
            batch.create_check_constraint('metric', _in('metric', values))
    _views()


def upgrade() -> None:
    op.add_column('invocations', sa.Column('max_rss_kb', sa.BigInteger(), nullable=True))
    op.create_table(
        'measurements',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('comparison_id', sa.Integer(), nullable=False),
        sa.Column('phase', sa.String(16), nullable=False),
        sa.Column('metric', sa.String(16), nullable=False),
        sa.Column('unit', sa.String(16), nullable=False),
        sa.Column('verdict', sa.String(32), nullable=False),
        sa.Column('change_pct', sa.Float(), nullable=True),
        sa.Column('ci_low_pct', sa.Float(), nullable=True),
        sa.Column('ci_high_pct', sa.Float(), nullable=True),
        sa.Column('p_value', sa.Float(), nullable=True),
        sa.Column('control_value', sa.Float(), nullable=True),
        sa.Column('treatment_value', sa.Float(), nullable=True),
        sa.Column('control_values', sa.JSON(), nullable=True),
        sa.Column('treatment_values', sa.JSON(), nullable=True),
        sa.Column('source', sa.String(32), nullable=True),
        sa.Column('failure', sa.Text(), nullable=True),
        sa.Column('judged', sa.JSON(), nullable=False),
        sa.CheckConstraint(_in('phase', PHASES), name=op.f('ck_measurements_phase')),
        sa.CheckConstraint(_in('verdict', OUTCOMES), name=op.f('ck_measurements_verdict')),
        sa.ForeignKeyConstraint(['comparison_id'], ['comparisons.id'],
                                name=op.f('fk_measurements_comparison_id_comparisons'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_measurements')),
        sa.UniqueConstraint('comparison_id', 'phase', 'metric', name=op.f('uq_measurements_comparison_id')),
    )
    op.create_index('ix_measurements_metric_phase', 'measurements', ['metric', 'phase'])
    _metric_check(None)
    _move_details()


def _move_details() -> None:
    """Today's comparisons as rows: the run-time verdict from the comparison's columns, the
    others from ``details``, where a verdict was made."""
    bind = op.get_bind()
    json_columns = ('control_values', 'treatment_values', 'judged')
    table = sa.table('measurements', *(sa.column(c, sa.JSON() if c in json_columns else None) for c in (
        'comparison_id', 'phase', 'metric', 'unit', 'verdict', 'change_pct', 'ci_low_pct', 'ci_high_pct', 'p_value',
        'control_value', 'treatment_value', 'control_values', 'treatment_values', 'source', 'failure', 'judged')))
    rows = []
    found = bind.execute(sa.text(
        "SELECT id, verdict, change_pct, ci_low_pct, ci_high_pct, p_value, control_median_ms, treatment_median_ms, "
        "error, details FROM comparisons"))
    for (cid, verdict, change, low, high, p, control, treatment, error, details) in found:
        details = json.loads(details) if isinstance(details, str) else (details or {})
        whole = details.get("verdict") or {}
        first = 'instructions' if whole.get("unit") == 'instructions' else 'time'
        counts = details.get("instructions") if first == 'instructions' else None
        counts = counts if isinstance(counts, dict) else {}
        rows.append(dict(comparison_id=cid, phase='runtime', metric=first, unit=whole.get("unit") or "ms",
                         verdict=verdict, change_pct=change, ci_low_pct=low, ci_high_pct=high, p_value=p,
                         control_value=control, treatment_value=treatment,
                         # a run-time verdict's values are its samples (in `samples`); a count's, its counts
                         control_values=counts.get("control_counts"), treatment_values=counts.get("treatment_counts"),
                         source=counts.get("source"), failure=error, judged=whole))
        for key, phase, metric, unit, values in (
                ('compile', 'compile-time', 'time', 'ms', ('control_ms', 'treatment_ms')),
                ('instructions', 'runtime', 'instructions', 'instructions', ('control_counts', 'treatment_counts')),
                ('compile_instructions', 'compile-time', 'instructions', 'instructions',
                 ('control_counts', 'treatment_counts'))):
            kept = details.get(key)
            if not isinstance(kept, dict) or not kept.get("verdict"):
                continue
            if phase == 'runtime' and metric == first:
                continue  # the comparison's own verdict is this one (its row is above)
            ci = kept.get("ci_pct") or [None, None]
            rows.append(dict(comparison_id=cid, phase=phase, metric=metric, unit=unit, verdict=kept["verdict"],
                             change_pct=kept.get("change_pct"), ci_low_pct=ci[0], ci_high_pct=ci[1],
                             p_value=kept.get("p_value"), control_value=kept.get("control_median_ms"),
                             treatment_value=kept.get("treatment_median_ms"),
                             control_values=kept.get(values[0]), treatment_values=kept.get(values[1]),
                             source=kept.get("source"), failure=kept.get("failure"),
                             judged={k: v for k, v in kept.items() if k not in values and k != "profile"}))
    if rows:
        op.bulk_insert(table, rows)


def downgrade() -> None:
    op.execute("UPDATE regressions SET metric = 'time' WHERE metric NOT IN ('time', 'instructions')")
    _metric_check(('time', 'instructions'))
    op.drop_index('ix_measurements_metric_phase', table_name='measurements')
    op.drop_table('measurements')
    with op.batch_alter_table('invocations') as batch:
        batch.drop_column('max_rss_kb')
