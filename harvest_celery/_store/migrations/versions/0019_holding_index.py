"""a partial index of the activity rows holding a slot of their limit (``scheduled`` or
``running``), by (activity name, key digest). A limit's settle counts those rows while it holds
the limit row's lock; through ``ix_harvest_activity_tasks_waiting`` that count also walked the
limit's completed rows, which only grow (a benchmark's settle spent 0.46 ms of its 0.58 ms on
them, with the lock held). docs/flow-control.md, "What a limit costs".

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

TASKS = "harvest_activity_tasks"
INDEX = "ix_harvest_activity_tasks_holding"
HOLDING = "status IN ('scheduled', 'running')"


def upgrade() -> None:
    op.create_index(
        INDEX,
        TASKS,
        ["activity_name", "limit_digest"],
        postgresql_where=sa.text(HOLDING),
        sqlite_where=sa.text(HOLDING),
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name=TASKS)
