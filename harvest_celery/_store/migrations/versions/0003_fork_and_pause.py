"""fork and pause

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("harvest_executions", sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("harvest_executions", sa.Column("forked_from", sa.String(length=200), nullable=True))
    op.add_column("harvest_executions", sa.Column("forked_to", sa.String(length=200), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_executions", "forked_to")
    op.drop_column("harvest_executions", "forked_from")
    op.drop_column("harvest_executions", "paused_at")
