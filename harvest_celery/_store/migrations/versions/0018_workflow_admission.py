"""workflow admission: a run's ``admitted_at`` (NULL while it waits for a slot of its
workflow's limit), ``admission_seq`` (its start order, from ``harvest_admission_seq``), its
start ``priority`` and its limit key (a payload: codec, tombstoned by erasure) with the key's
salted digest. docs/flow-control.md, "Workflow admission".

Every run that exists is admitted (the column's default fills them in), so an upgrade changes
nothing that runs; a downgrade refuses while a run waits (an older build would decide it).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_TS = sa.DateTime(timezone=True)
RUNS = "harvest_executions"
SEQ = "harvest_admission_seq"
INDEX = "ix_harvest_executions_admission"


class WaitingRuns(RuntimeError):
    """A downgrade found runs waiting for admission: nothing was changed."""


def upgrade() -> None:
    with op.batch_alter_table(RUNS) as batch:
        batch.add_column(sa.Column("admitted_at", _TS, server_default=sa.text("CURRENT_TIMESTAMP")))
        batch.add_column(sa.Column("admission_seq", sa.BigInteger()))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("limit_key", _JSON))
        batch.add_column(sa.Column("limit_digest", sa.String(80)))
    op.execute(sa.text(f"UPDATE {RUNS} SET admitted_at = created_at"))  # every run so far ran at once
    # status before admitted_at: a settle reads RUNNING rows only, never a key's closed runs
    op.create_index(INDEX, RUNS, ["workflow_type", "limit_digest", "status", "admitted_at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence(SEQ)))


def downgrade() -> None:
    conn = op.get_bind()
    waiting = conn.execute(
        sa.text(f"SELECT count(*) FROM {RUNS} WHERE admitted_at IS NULL AND status = 'RUNNING'")
    ).scalar()
    if waiting:
        raise WaitingRuns(
            f"{waiting} run(s) are waiting for admission, which the revision before 0018 would "
            "decide at once. Nothing was changed: let them be admitted (or cancel them) first."
        )
    if conn.dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence(SEQ)))
    op.drop_index(INDEX, table_name=RUNS)
    with op.batch_alter_table(RUNS) as batch:
        for column in ("limit_digest", "limit_key", "priority", "admission_seq", "admitted_at"):
            batch.drop_column(column)
