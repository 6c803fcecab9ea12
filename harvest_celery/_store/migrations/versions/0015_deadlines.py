"""deadlines: the TIMED_OUT run status and the execution_deadline_at / run_deadline_at /
timed_out_at / timeout_grace_at / timeout_overrun_at columns (docs/concepts.md, "Deadlines").

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# Frozen here (0010's set plus TIMED_OUT; 0013 and 0014 left the statuses as they were): a migration must not change when the package does.
BEFORE = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TERMINATED", "CONTINUED_AS_NEW")
AFTER = (*BEFORE, "TIMED_OUT")
CHECK = "ck_harvest_executions_status"
COLUMNS = (
    "execution_deadline_at",
    "run_deadline_at",
    "timed_out_at",
    "timeout_grace_at",
    "timeout_overrun_at",
)


def _condition(statuses):
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _recheck(statuses):
    with op.batch_alter_table("harvest_executions") as batch:
        batch.drop_constraint(CHECK, type_="check")
        batch.create_check_constraint(CHECK, _condition(statuses))


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("harvest_executions", sa.Column(column, sa.DateTime(timezone=True), nullable=True))
    _recheck(AFTER)


def downgrade() -> None:
    # a TIMED_OUT run would break the older constraint: it reads as FAILED there
    op.execute("UPDATE harvest_executions SET status = 'FAILED' WHERE status = 'TIMED_OUT'")
    _recheck(BEFORE)
    for column in reversed(COLUMNS):
        op.drop_column("harvest_executions", column)
