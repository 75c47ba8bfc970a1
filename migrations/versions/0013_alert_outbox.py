"""Alert deliveries become an outbox: one row per delivery, recorded `pending` before it is
sent, then `delivered` or `given_up`; webhooks stored by label, never by their URL.

Rows of the old shape (one per attempt, the URL as given) become `delivered` (the attempt
that got through) or `given_up`, their URL replaced by its redacted label.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 00:30:00
"""
import hashlib
from urllib.parse import urlsplit

from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def redact_endpoint(url: str) -> str:
    """A webhook URL's stored label: scheme and host, then a short hash of the whole URL
    (abwatch.builders.redact.redact_endpoint as it was when this revision was written: a copy,
    not an import, so that this migration does the same thing whatever abwatch runs it)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ''
        port = f':{parts.port}' if parts.port else ''
    except ValueError:
        host, port, parts = '', '', None
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    scheme = parts.scheme if parts is not None and parts.scheme else 'url'
    return f'{scheme}://{host}{port}/\u2026#{digest}'


# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ('alert_deliveries.next_at / delivered_at and pending or given-up states',
     "SELECT COUNT(*) FROM alert_deliveries WHERE status <> 'delivered' OR delivered_at IS NOT NULL"),
)

STATUSES = ("pending", "delivered", "given_up")


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table('alert_deliveries') as batch:
        batch.add_column(sa.Column('webhook', sa.String(length=1024), nullable=True))
        batch.add_column(sa.Column('status', sa.Enum(*STATUSES, name='delivery_status', native_enum=False,
                                                     create_constraint=True, length=32), nullable=True))
        batch.add_column(sa.Column('next_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True))
        batch.alter_column('attempt', new_column_name='attempts')
    rows = bind.execute(sa.text("SELECT id, url, ok, at FROM alert_deliveries")).all()
    for row_id, url, ok, at in rows:
        bind.execute(sa.text("UPDATE alert_deliveries SET webhook = :w, status = :s, delivered_at = :d "
                             "WHERE id = :id"),
                     {"w": url if url.startswith("env:") else redact_endpoint(url),
                      "s": "delivered" if ok else "given_up", "d": at if ok else None, "id": row_id})
    with op.batch_alter_table('alert_deliveries') as batch:
        batch.alter_column('webhook', existing_type=sa.String(length=1024), nullable=False)
        batch.alter_column('status', existing_type=sa.String(length=32), nullable=False)
        batch.drop_column('url')
        batch.drop_column('ok')
        batch.create_index(batch.f('ix_alert_deliveries_status'), ['status'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('alert_deliveries') as batch:
        batch.drop_index(batch.f('ix_alert_deliveries_status'))
        batch.add_column(sa.Column('url', sa.String(length=1024), nullable=True))
        batch.add_column(sa.Column('ok', sa.Boolean(), nullable=True))
    op.execute("UPDATE alert_deliveries SET url = webhook, ok = (status = 'delivered')")
    with op.batch_alter_table('alert_deliveries') as batch:
        batch.drop_constraint(batch.f('ck_alert_deliveries_delivery_status'), type_='check')
        batch.drop_column('webhook')
        batch.drop_column('status')
        batch.drop_column('next_at')
        batch.drop_column('delivered_at')
        batch.alter_column('attempts', new_column_name='attempt')
