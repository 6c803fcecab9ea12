"""outbox execution id: an unsent outbox row names its run in a column, so erasing a run deletes
its own rows by equality (a task-id LIKE '{id}:%' also matched the rows of a run named '{id}:b')

Revision ID: 0006
Revises: 0005d
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005d"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _execution_id(args, headers):
    """The run of a row as builds before 0006 wrote it: an adopted task's ids are in its
    ``harvest`` header (its argument is the input); a decision's and an engine-native
    activity's first argument is the execution id. Kept here, frozen: a migration must not
    change when the package does (``records.outbox_execution_id`` is the live copy)."""
    ref = headers.get("harvest") if isinstance(headers, dict) else None
    if isinstance(ref, dict) and isinstance(ref.get("execution_id"), str):
        return ref["execution_id"]
    if isinstance(args, list) and args and isinstance(args[0], str):
        return args[0]
    return None


def upgrade() -> None:
    op.add_column("harvest_outbox", sa.Column("execution_id", sa.String(length=200), nullable=True))
    op.create_index("ix_harvest_outbox_execution_id", "harvest_outbox", ["execution_id"])
    # Backfill the unsent rows an older build left (a handful: the relay sends and deletes them).
    # Rows an older worker writes after this migration, during a rolling deploy, have no
    # execution id; erasure derives it for them the same way.
    outbox = sa.table(
        "harvest_outbox",
        sa.column("id", sa.Integer()),
        sa.column("args", _JSON),
        sa.column("headers", _JSON),
        sa.column("execution_id", sa.String(200)),
    )
    conn = op.get_bind()
    for row in conn.execute(sa.select(outbox.c.id, outbox.c.args, outbox.c.headers)).all():
        execution_id = _execution_id(row.args, row.headers)
        if execution_id is not None:
            conn.execute(outbox.update().where(outbox.c.id == row.id).values(execution_id=execution_id))


def downgrade() -> None:
    op.drop_index("ix_harvest_outbox_execution_id", table_name="harvest_outbox")
    op.drop_column("harvest_outbox", "execution_id")
