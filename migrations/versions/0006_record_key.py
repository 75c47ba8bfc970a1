"""Records get a key (a hash of their content), so importing the same record twice stores it once.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 08:30:00
"""
import hashlib
import json

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

CORE = ("workload", "engine", "hardware", "runtime_ms_mean", "runtime_ms_std", "timestamp", "schema_version")


def _key(row) -> str:
    # the same canonical form as service.records.v01.record_key, frozen here as of this revision
    record = {name: getattr(row, name) for name in CORE}
    record.update(row.fields or {})
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def upgrade() -> None:
    op.add_column('records', sa.Column('record_key', sa.String(length=64), nullable=True))
    records = sa.table('records', sa.column('id', sa.Integer), sa.column('record_key', sa.String),
                       sa.column('fields', sa.JSON), sa.column('timestamp', sa.JSON),
                       *(sa.column(name) for name in CORE if name != "timestamp"))
    connection = op.get_bind()
    seen = set()
    for row in connection.execute(sa.select(records).order_by(records.c.id)).all():
        key = _key(row)
        if key in seen:
            continue  # an earlier duplicate keeps the key; this copy stays as it was, unkeyed
        seen.add(key)
        connection.execute(records.update().where(records.c.id == row.id).values(record_key=key))
    op.create_index(op.f('ix_records_record_key'), 'records', ['record_key'], unique=True)


def downgrade() -> None:
    op.drop_index(op.f('ix_records_record_key'), table_name='records')
    # batch mode: SQLite drops columns by rebuilding the table
    with op.batch_alter_table('records') as batch:
        batch.drop_column('record_key')
