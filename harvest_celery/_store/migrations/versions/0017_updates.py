"""updates: the harvest_workflow_updates table, one row per accepted update (primary key
execution_id, update_id), written with its UpdateAccepted event (docs/concepts.md, "Updates").

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLE = "harvest_workflow_updates"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column(
            "execution_id",
            sa.String(200),
            sa.ForeignKey("harvest_executions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("update_id", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(TABLE)
