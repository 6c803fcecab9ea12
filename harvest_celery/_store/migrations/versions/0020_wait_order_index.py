"""the waiting rows of each limit and key in their wait order (compensations first, then
priority descending, then ``wait_seq``): a partial index of ``waiting`` rows only, replacing
``ix_harvest_activity_tasks_waiting`` (name, digest, status). Every release (a settle, a
hand-off, a waker) takes the first waiting rows of its limit and key; through the old index it
read every waiting row of that key and sorted them, with the limit row's lock held by a settle:
7.4 ms per release behind a backlog of 20,000 waiting rows, against 0.03 ms through this one
(``benchmarks/backlog.py``). It also holds no entry for a row that is not waiting, so no other
status change of any task row writes to it. docs/flow-control.md, "What a limit costs".

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TASKS = "harvest_activity_tasks"
INDEX = "ix_harvest_activity_tasks_wait_order"
OLD = "ix_harvest_activity_tasks_waiting"
WAITING = "status = 'waiting'"


def upgrade() -> None:
    op.create_index(
        INDEX,
        TASKS,
        ["activity_name", "limit_digest", sa.text("compensation DESC"), sa.text("priority DESC"), "wait_seq"],
        postgresql_where=sa.text(WAITING),
        sqlite_where=sa.text(WAITING),
    )
    op.drop_index(OLD, table_name=TASKS)


def downgrade() -> None:
    op.create_index(OLD, TASKS, ["activity_name", "limit_digest", "status"])
    op.drop_index(INDEX, table_name=TASKS)
