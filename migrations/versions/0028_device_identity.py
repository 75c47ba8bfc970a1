"""Device identity: a device row per (name, fingerprint), the hosts that serve each device name.

``devices`` gains ``fingerprint`` (the part of the runner's description whose change starts a
new series: CPU model and flags, cores, memory, kernel, GPUs and drivers, TVM target),
``fingerprint_hash``, ``first_seen_at`` and ``last_seen_at``; its unique key becomes (name,
fingerprint_hash). Rows stored before have an empty hash (the first fingerprint seen under
their name takes them over) and their first and last run's start as the times they were seen.
``device_hosts``: one row per device name, the worker that registered it, its heartbeat and the
data-stoppage alert (``stale_since``). ``workload_series`` partitions by the device row as well
as its name, so a commit measured on two fingerprints of one device is a point on each series.

Self-contained but for 0018's ``workload_series``, which downgrade() puts back as it was.
It revises 0026: no 0027 was ever released (the number was given to a change that did not land).

Revision ID: 0028
Revises: 0026
Create Date: 2026-11-27 09:00:00
"""
import importlib

from alembic import op
import sqlalchemy as sa


revision = '0028'
down_revision = '0026'
branch_labels = None
depends_on = None

# What downgrade() drops or changes, counted by `abwatch db downgrade` before it asks for --yes.
DOWNGRADE_LOSES = (
    ("devices' fingerprints", "SELECT COUNT(*) FROM devices WHERE fingerprint_hash <> ''"),
    ("device_hosts: the workers' registrations and heartbeats", "SELECT COUNT(*) FROM device_hosts"),
    ("devices whose name another fingerprint has too: renamed <name>@<fingerprint hash> (one row per name before)",
     "SELECT COUNT(*) FROM devices d WHERE EXISTS (SELECT 1 FROM devices o WHERE o.name = d.name AND o.id < d.id)"),
)

PARTITION_0018 = "PARTITION BY s.workload_id, s.workload, s.repository, s.spec_hash, s.device, s.commit_id"
PARTITION = "PARTITION BY s.workload_id, s.workload, s.repository, s.spec_hash, s.device, s.device_id, s.commit_id"


def _series_0018() -> str:
    return importlib.import_module('abwatch.migrations.versions.0018_fastest_series').WORKLOAD_SERIES


def _legacy_alter() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")  # views are not re-checked mid-rebuild (as in 0009)


def upgrade() -> None:
    op.execute('DROP VIEW workload_series')
    _legacy_alter()
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('fingerprint', sa.JSON(), nullable=False, server_default='{}'))
        batch.add_column(sa.Column('fingerprint_hash', sa.String(length=64), nullable=False, server_default=''))
        batch.add_column(sa.Column('first_seen_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=True))
        batch.drop_constraint(op.f('uq_devices_name'), type_='unique')
        batch.create_unique_constraint('uq_devices_name_fingerprint', ['name', 'fingerprint_hash'])
    op.execute("UPDATE devices SET first_seen_at = (SELECT MIN(r.started_at) FROM runs r WHERE r.device_id = devices.id),"
               " last_seen_at = (SELECT MAX(r.started_at) FROM runs r WHERE r.device_id = devices.id)")
    op.create_table(
        'device_hosts',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=256), nullable=False),
        sa.Column('device_id', sa.Integer(), nullable=True),
        sa.Column('host', sa.String(length=255), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('registered_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('stale_since', sa.DateTime(timezone=True), nullable=True),
        sa.Column('message', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_device_hosts_device_id_devices')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_device_hosts')),
        sa.UniqueConstraint('name', name=op.f('uq_device_hosts_name')),
    )
    series = _series_0018()
    assert series.count(PARTITION_0018) == 1
    op.execute(series.replace(PARTITION_0018, PARTITION))


def downgrade() -> None:
    op.execute('DROP VIEW workload_series')
    op.drop_table('device_hosts')
    # one row per name again: every fingerprint after a name's first keeps its runs under a name of its own
    op.execute("UPDATE devices SET name = substr(name, 1, 243) || '@' || substr(fingerprint_hash, 1, 12) "
               "WHERE EXISTS (SELECT 1 FROM devices o WHERE o.name = devices.name AND o.id < devices.id)")
    _legacy_alter()
    with op.batch_alter_table('devices') as batch:
        batch.drop_constraint('uq_devices_name_fingerprint', type_='unique')
        batch.create_unique_constraint(op.f('uq_devices_name'), ['name'])
        batch.drop_column('last_seen_at')
        batch.drop_column('first_seen_at')
        batch.drop_column('fingerprint_hash')
        batch.drop_column('fingerprint')
    op.execute(_series_0018())
