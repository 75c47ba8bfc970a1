"""A bisection step's side (good, bad, skip) gets its own column; side and verdict are enums with CHECKs.

Steps were stored with the side inside the verdict text, ``"regression (bad)"``; they are
split here, so SQL can ask for a step's side without parsing text.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24 07:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

SIDES = ("good", "bad", "skip")
VERDICTS = ("regression", "improvement", "same", "unknown", "failed", "build_failed")


def _listed(values) -> str:
    return ", ".join(f"'{v}'" for v in values)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")  # views are not re-checked mid-rebuild (as in 0009)
    with op.batch_alter_table('bisection_steps') as batch:
        batch.add_column(sa.Column('side', sa.String(8), nullable=True))
    steps = sa.table('bisection_steps', sa.column('id'), sa.column('verdict'), sa.column('side'))
    for step_id, text in bind.execute(sa.select(steps.c.id, steps.c.verdict)).all():
        verdict, _, side = text.partition(" (")
        side = side.rstrip(")") or ("skip" if verdict in ("failed", "build_failed") else "bad")
        if verdict not in VERDICTS or side not in SIDES:
            raise RuntimeError(f"bisection_steps {step_id}: cannot read verdict {text!r}")
        bind.execute(steps.update().where(steps.c.id == step_id).values(verdict=verdict, side=side))
    with op.batch_alter_table('bisection_steps') as batch:
        batch.alter_column('side', existing_type=sa.String(8), nullable=False)
        batch.create_check_constraint('step_side', sa.text(f"side IN ({_listed(SIDES)})"))
        batch.create_check_constraint('step_verdict', sa.text(f"verdict IN ({_listed(VERDICTS)})"))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute("PRAGMA legacy_alter_table=ON")
    with op.batch_alter_table('bisection_steps') as batch:
        batch.drop_constraint(op.f('ck_bisection_steps_step_verdict'), type_='check')
        batch.drop_constraint(op.f('ck_bisection_steps_step_side'), type_='check')
    steps = sa.table('bisection_steps', sa.column('id'), sa.column('verdict'), sa.column('side'))
    bind.execute(steps.update().values(verdict=steps.c.verdict + " (" + steps.c.side + ")"))
    with op.batch_alter_table('bisection_steps') as batch:
        batch.drop_column('side')
