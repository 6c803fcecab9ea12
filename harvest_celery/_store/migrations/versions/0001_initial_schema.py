"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _executions()
    _outbox()
    _activity_tasks()
    _events()
    _timers()


def _executions() -> None:
    op.create_table(
        "harvest_executions",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("workflow_type", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("decision_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("nd_blocked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("nd_block_reason", sa.Text(), nullable=True),
        sa.Column("nd_block_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "nd_details",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("nd_retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_harvest_executions_decision_requested_at",
        "harvest_executions",
        ["decision_requested_at"],
        unique=False,
    )
    op.create_index("ix_harvest_executions_nd_retry_at", "harvest_executions", ["nd_retry_at"], unique=False)
    op.create_index("ix_harvest_executions_status", "harvest_executions", ["status"], unique=False)
    op.create_index(
        "ix_harvest_executions_workflow_type", "harvest_executions", ["workflow_type"], unique=False
    )


def _outbox() -> None:
    op.create_table(
        "harvest_outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column(
            "args",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "headers",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("task_id", sa.String(length=300), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_harvest_outbox_created_at", "harvest_outbox", ["created_at"], unique=False)


def _activity_tasks() -> None:
    op.create_table(
        "harvest_activity_tasks",
        sa.Column("execution_id", sa.String(length=200), nullable=False),
        sa.Column("activity_id", sa.String(length=40), nullable=False),
        sa.Column("activity_name", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "retry",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("start_to_close", sa.Float(), nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("compensation", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("adopted", sa.Boolean(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(["execution_id"], ["harvest_executions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", "activity_id"),
    )
    op.create_index("ix_harvest_activity_tasks_status", "harvest_activity_tasks", ["status"], unique=False)


def _events() -> None:
    op.create_table(
        "harvest_events",
        sa.Column("execution_id", sa.String(length=200), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["execution_id"], ["harvest_executions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", "seq"),
    )


def _timers() -> None:
    op.create_table(
        "harvest_timers",
        sa.Column("execution_id", sa.String(length=200), nullable=False),
        sa.Column("timer_id", sa.String(length=40), nullable=False),
        sa.Column("fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fired", sa.Boolean(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(["execution_id"], ["harvest_executions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("execution_id", "timer_id"),
    )
    op.create_index("ix_harvest_timers_due", "harvest_timers", ["fired", "fire_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_harvest_timers_due", table_name="harvest_timers")
    op.drop_table("harvest_timers")
    op.drop_table("harvest_events")
    op.drop_index("ix_harvest_activity_tasks_status", table_name="harvest_activity_tasks")
    op.drop_table("harvest_activity_tasks")
    op.drop_index("ix_harvest_outbox_created_at", table_name="harvest_outbox")
    op.drop_table("harvest_outbox")
    op.drop_index("ix_harvest_executions_workflow_type", table_name="harvest_executions")
    op.drop_index("ix_harvest_executions_status", table_name="harvest_executions")
    op.drop_index("ix_harvest_executions_nd_retry_at", table_name="harvest_executions")
    op.drop_index("ix_harvest_executions_decision_requested_at", table_name="harvest_executions")
    op.drop_table("harvest_executions")
