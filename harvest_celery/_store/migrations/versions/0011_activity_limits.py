"""activity limits: the ``waiting`` task status, a task row's priority, limit key and wait order,
and the limits table (one row per limit name and key digest: declared and override values,
``in_use``, GCRA's theoretical arrival time). docs/flow-control.md.

The task-status CHECK constraint is replaced by one listing its own frozen set, ``waiting``
included; a downgrade refuses while a row is ``waiting`` (an older build cannot read it).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_TS = sa.DateTime(timezone=True)
TASKS = "harvest_activity_tasks"
CHECK = f"ck_{TASKS}_status"
# Frozen here (names.TASK_STATUSES is the live set).
BEFORE = ("scheduled", "running", "retry_wait", "completed", "failed", "cancelled")
AFTER = (*BEFORE, "waiting")
WAIT_SEQ = "harvest_wait_seq"


class WaitingRows(RuntimeError):
    """A downgrade found rows held back by a limit: nothing was changed."""


def _condition(statuses):
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _set_check(statuses):
    with op.batch_alter_table(TASKS) as batch:
        batch.drop_constraint(CHECK, type_="check")
        batch.create_check_constraint(CHECK, _condition(statuses))


def upgrade() -> None:
    op.create_table(
        "harvest_limits",
        sa.Column("name", sa.String(200), primary_key=True),
        # "" for the name's own row (its declared and override values); else the salted digest
        # of one key: the key itself is payload and lives only on the task row, through the codec
        sa.Column("key_digest", sa.String(80), primary_key=True),
        sa.Column("declared_concurrency", sa.Integer()),
        sa.Column("declared_rate_limit", sa.String(40)),
        sa.Column("override_concurrency", sa.Integer()),
        sa.Column("override_rate_limit", sa.String(40)),
        sa.Column("override_set_at", _TS),
        sa.Column("in_use", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("tat", _TS),  # GCRA's theoretical arrival time (clock_timestamp())
        sa.Column("updated_at", _TS),
    )
    with op.batch_alter_table(TASKS) as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("limit_key", _JSON))  # a payload: codec, tombstoned by erasure
        batch.add_column(sa.Column("limit_digest", sa.String(80)))  # NULL: not limited
        batch.add_column(sa.Column("wait_seq", sa.BigInteger()))  # FIFO within a priority
    op.create_index("ix_harvest_activity_tasks_waiting", TASKS, ["activity_name", "limit_digest", "status"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence(WAIT_SEQ)))
    _set_check(AFTER)


def downgrade() -> None:
    conn = op.get_bind()
    waiting = conn.execute(sa.text(f"SELECT count(*) FROM {TASKS} WHERE status = 'waiting'")).scalar()
    if waiting:
        raise WaitingRows(
            f"{waiting} activity task row(s) are 'waiting' for a limit, which the revision before "
            f"0011 cannot hold. Nothing was changed: let them run (or cancel their runs) first."
        )
    _set_check(BEFORE)
    if conn.dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence(WAIT_SEQ)))
    op.drop_index("ix_harvest_activity_tasks_waiting", table_name=TASKS)
    with op.batch_alter_table(TASKS) as batch:
        for column in ("wait_seq", "limit_digest", "limit_key", "priority"):
            batch.drop_column(column)
    op.drop_table("harvest_limits")
