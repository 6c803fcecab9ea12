"""schedule tasks: a schedule's target is a workflow or an adopted Celery task (import-beat)

A task schedule (``target = 'task'``) names the adopted task in ``workflow`` and keeps the
task's queue in ``queue`` (NULL: the adopted definition's); its stored input is the call,
``{"args": [...], "kwargs": {...}}``, a payload like a workflow schedule's input. Each tick
starts the built-in ``harvest.start_task`` run. Existing rows are workflow schedules.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("harvest_schedules") as batch:
        batch.add_column(sa.Column("target", sa.String(16), nullable=False, server_default="workflow"))
        batch.add_column(sa.Column("queue", sa.String(200)))


def downgrade() -> None:
    with op.batch_alter_table("harvest_schedules") as batch:
        batch.drop_column("queue")
        batch.drop_column("target")
