"""child workflows and continue-as-new: the CONTINUED_AS_NEW run status, the parent_id /
continued_from / continued_to links, and harvest_child_notices (a child's close, waiting to be
applied in its parent's transaction).

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None

# Frozen here (0007's set plus CONTINUED_AS_NEW): a migration must not change when the package does.
BEFORE = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TERMINATED")
AFTER = (*BEFORE, "CONTINUED_AS_NEW")
CHECK = "ck_harvest_executions_status"
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _condition(statuses):
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


def _recheck(statuses):
    with op.batch_alter_table("harvest_executions") as batch:
        batch.drop_constraint(CHECK, type_="check")
        batch.create_check_constraint(CHECK, _condition(statuses))


def upgrade() -> None:
    for column in ("parent_id", "continued_from", "continued_to"):
        op.add_column("harvest_executions", sa.Column(column, sa.String(length=200), nullable=True))
    op.create_index("ix_harvest_executions_parent_id", "harvest_executions", ["parent_id"])
    _recheck(AFTER)
    op.create_table(
        "harvest_child_notices",
        sa.Column("parent_id", sa.String(length=200), primary_key=True),
        sa.Column("child_id", sa.String(length=200), primary_key=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", Json),
        sa.Column("error", Json),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_harvest_child_notices_created_at", "harvest_child_notices", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_harvest_child_notices_created_at", table_name="harvest_child_notices")
    op.drop_table("harvest_child_notices")
    _recheck(BEFORE)
    op.drop_index("ix_harvest_executions_parent_id", table_name="harvest_executions")
    for column in ("continued_to", "continued_from", "parent_id"):
        op.drop_column("harvest_executions", column)
