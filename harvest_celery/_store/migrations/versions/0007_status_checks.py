"""status checks: harvest_executions.status and harvest_activity_tasks.status hold only the known
statuses (a CHECK constraint each). A later status is added by a migration altering the constraint.

If a row holds a status outside the set, the migration stops before it changes anything, with a
message naming the values and how many rows hold each.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Frozen here: a migration must not change when the package does (lifecycle.RUN_STATUSES and
# names.TASK_STATUSES are the live sets; a migration that extends them lists its own).
CHECKS = (
    ("harvest_executions", ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TERMINATED")),
    ("harvest_activity_tasks", ("scheduled", "running", "retry_wait", "completed", "failed", "cancelled")),
)


class UnknownStatus(RuntimeError):
    """Rows hold statuses outside the set: nothing was changed."""


def _name(table):
    return f"ck_{table}_status"


def _condition(statuses):
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def unknown_statuses(conn):
    """``{table: [(status, rows), ...]}`` of the statuses outside each table's set."""
    found = {}
    for table, statuses in CHECKS:
        t = sa.table(table, sa.column("status", sa.String()))
        rows = conn.execute(
            sa.select(t.c.status, sa.func.count())
            .where(t.c.status.not_in(statuses))
            .group_by(t.c.status)
            .order_by(t.c.status)
        ).all()
        if rows:
            found[table] = [(status, count) for status, count in rows]
    return found


def upgrade() -> None:
    found = unknown_statuses(op.get_bind())
    if found:
        detail = "; ".join(
            f"{table}.status: " + ", ".join(f"{s!r} ({n} row{'s' if n != 1 else ''})" for s, n in rows)
            for table, rows in found.items()
        )
        raise UnknownStatus(
            f"migration 0007 adds CHECK constraints on the status columns, but rows hold statuses "
            f"outside the known set: {detail}. Nothing was changed; correct or delete those rows "
            f"(or upgrade the code that wrote them) and run the migration again."
        )
    for table, statuses in CHECKS:
        with op.batch_alter_table(table) as batch:
            batch.create_check_constraint(_name(table), _condition(statuses))


def downgrade() -> None:
    for table, _statuses in CHECKS:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(_name(table), type_="check")
