"""attempt errors: every failed attempt's error with its traceback; sticky decision routing

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "harvest_attempt_errors",
        sa.Column("execution_id", sa.String(length=200), nullable=False),
        sa.Column("activity_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(length=200), nullable=False),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["execution_id"], ["harvest_executions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", "activity_id", "attempt"),
    )
    op.add_column("harvest_executions", sa.Column("sticky_queue", sa.String(length=300), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_executions", "sticky_queue")
    op.drop_table("harvest_attempt_errors")
