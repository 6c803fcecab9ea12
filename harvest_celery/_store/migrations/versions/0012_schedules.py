"""schedules: durable schedules that replace Celery Beat (docs/schedules.md)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "harvest_schedules",
        sa.Column("name", sa.String(180), primary_key=True),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("decision_queue", sa.String(200), nullable=False),
        sa.Column("cron", sa.String(200)),
        sa.Column("every_seconds", sa.Integer()),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("jitter_seconds", sa.Float(), nullable=False),
        sa.Column("overlap", sa.String(20), nullable=False),
        sa.Column("catchup_seconds", sa.Float(), nullable=False),
        sa.Column("end_at", _TS),
        sa.Column("max_runs", sa.Integer()),
        sa.Column("input", _JSON),
        sa.Column("input_digest", sa.String(80)),
        sa.Column("spec_version", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("pause_note", sa.Text()),
        sa.Column("last_tick", _TS, nullable=False),
        sa.Column("next_fire_at", _TS),
        sa.Column("buffered_tick", _TS),
        sa.Column("last_run_id", sa.String(200)),
        sa.Column("backfill_from", _TS),
        sa.Column("backfill_to", _TS),
        sa.Column("backfill_cursor", _TS),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("fired", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("missed", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
    )
    op.create_index("ix_harvest_schedules_due", "harvest_schedules", ["decision_queue", "next_fire_at"])


def downgrade() -> None:
    op.drop_index("ix_harvest_schedules_due", table_name="harvest_schedules")
    op.drop_table("harvest_schedules")
