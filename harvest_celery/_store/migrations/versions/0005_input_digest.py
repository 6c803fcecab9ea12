"""input digest: a second start of an execution id is compared with the first one's input

Revision ID: 0005d
Revises: 0005c
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005d"
# chained after the cooperative-cancellation revision (0005c); both were written off 0004
down_revision = "0005c"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no backfill: a run started before it has no digest, and a second start of such an
    # id is compared with its decoded input when that can still be read (runs.start).
    op.add_column("harvest_executions", sa.Column("input_digest", sa.String(length=80), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_executions", "input_digest")
