"""the run's own decision queue: written at start, so that every later decision request —
whichever process makes it (a sweeper firing a timer, a lease expiry, a lost-request re-send, a
signal) — goes to the queue of the app that started the run, not to the requesting process's.
Two apps on one database (each with its own decision queue) no longer decide each other's runs.
NULL: a run started before this migration; its requests go where they always went.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("harvest_executions", sa.Column("decision_queue", sa.String(length=300), nullable=True))


def downgrade() -> None:
    op.drop_column("harvest_executions", "decision_queue")
