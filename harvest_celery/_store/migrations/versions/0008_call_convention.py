"""call convention: how an adopted task is called with its recorded input (NULL: as its one
argument, every row before this; "args_kwargs": the input is the whole call, body(*args,
**kwargs)). The ActivityScheduled event records the same, as data; the task row carries it so
that re-sends and retries build the same message. Workers must be upgraded after this runs:
an older worker would pass {args, kwargs} as one argument.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("harvest_activity_tasks", sa.Column("call_convention", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_activity_tasks", "call_convention")
