"""trace context: the nullable ``traceparent`` column of the runs table — the W3C traceparent of
the run span pre-allocated at start, written by the start's own statement (docs/observability.md,
"Tracing"). Not user data, not a payload field, not part of the idempotent-start comparison.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("harvest_executions", sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_executions", "traceparent")
