"""The tables. Alembic migrations in ``migrations/`` must produce exactly this metadata (a test
pins it)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    String,
    Table,
    Text,
)
from sqlalchemy import text as sa_text
from sqlalchemy.dialects import postgresql

from harvest_celery._core.lifecycle import RUN_STATUSES
from harvest_celery._core.names import TASK_STATUSES, TaskStatus

# the task rows that hold a slot of their limit (``limits.HOLDING``): a partial index's predicate
HOLDING_PREDICATE = f"status IN ('{TaskStatus.SCHEDULED.value}', '{TaskStatus.RUNNING.value}')"
# the task rows waiting for a slot or a token of their limit: the wait-order index's predicate
WAITING_PREDICATE = f"status = '{TaskStatus.WAITING.value}'"

metadata = MetaData()

Json = JSON().with_variant(postgresql.JSONB(), "postgresql")
Ts = DateTime(timezone=True)


def status_check(table: str, statuses: tuple[str, ...]) -> CheckConstraint:
    """The status column holds one of the constants (migration 0007; a new status alters it)."""
    listed = ", ".join(f"'{s}'" for s in statuses)
    return CheckConstraint(f"status IN ({listed})", name=f"ck_{table}_status")


executions = Table(
    "harvest_executions",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("workflow_type", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("input", Json),
    Column("result", Json),
    Column("error", Json),
    Column("next_seq", Integer, nullable=False),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    Column("closed_at", Ts),
    Column("cancelled_at", Ts),
    Column("cancel_reason", Text),
    # an open cooperative cancellation request (its reason is cancel_reason): derived CANCELLING
    Column("cancel_requested_at", Ts),
    # set while a decision is requested and not yet taken (the decision "outbox" flag)
    Column("decision_requested_at", Ts),
    Column("nd_blocked_at", Ts),
    Column("nd_block_reason", Text),
    Column("nd_block_count", Integer, nullable=False, server_default="0"),
    Column("nd_details", Json),
    Column("nd_retry_at", Ts),
    Column("erased_at", Ts),
    Column("paused_at", Ts),
    # the fork mechanism (DAG retry-from-node, reset): recorded on both rows
    Column("forked_from", String(200)),
    Column("forked_to", String(200)),
    # the decision queue of the worker process holding the run's warm replay (sticky routing)
    Column("sticky_queue", String(300)),
    Column("decision_queue", String(300)),  # the starting app's; NULL before 0013
    # sha256 of the id and the canonical JSON of the input, taken before any codec: a second
    # start of the id is compared with it (survives encryption and erasure; _payloads.digest)
    Column("input_digest", String(80)),
    # child workflows and continue-as-new chains (migration 0010): the parent that started this
    # run; the previous and the next link of its chain
    Column("parent_id", String(200)),
    Column("continued_from", String(200)),
    Column("continued_to", String(200)),
    # deadlines (migration 0015): the execution deadline spans a continue-as-new chain, the run
    # deadline this run; timed_out_at: the sweeper's timeout request; timeout_grace_at: when it
    # seals a run that has not ended (no unwind begun); timeout_overrun_at: the grace ended
    # mid-unwind, so it was left running
    Column("execution_deadline_at", Ts),
    Column("run_deadline_at", Ts),
    Column("timed_out_at", Ts),
    Column("timeout_grace_at", Ts),
    Column("timeout_overrun_at", Ts),
    # the run span's W3C traceparent, pre-allocated at start (migration 0016; tracing on only)
    Column("traceparent", String(55)),
    # workflow admission (migration 0018, docs/flow-control.md): NULL admitted_at is a run
    # waiting for a slot of its workflow's limit (derived WAITING); every insert that names no
    # value is admitted at once (an unlimited workflow's start keeps its one statement).
    # admission_seq: its start order (harvest_admission_seq); the key is a payload (codec,
    # tombstoned by erasure), limit_digest its salted digest (the harvest_limits row). Never part
    # of event matching.
    Column("admitted_at", Ts, server_default=sa_text("CURRENT_TIMESTAMP")),
    Column("admission_seq", BigInteger),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("limit_key", Json),
    Column("limit_digest", String(80)),
    Index("ix_harvest_executions_status", "status"),
    # status before admitted_at: a settle counts and picks among RUNNING rows only, never
    # scanning a key's closed runs (which only grow)
    Index("ix_harvest_executions_admission", "workflow_type", "limit_digest", "status", "admitted_at"),
    Index("ix_harvest_executions_parent_id", "parent_id"),
    Index("ix_harvest_executions_workflow_type", "workflow_type"),
    Index("ix_harvest_executions_decision_requested_at", "decision_requested_at"),
    Index("ix_harvest_executions_nd_retry_at", "nd_retry_at"),
    status_check("harvest_executions", RUN_STATUSES),
)

events = Table(
    "harvest_events",
    metadata,
    Column(
        "execution_id", String(200), ForeignKey("harvest_executions.id", ondelete="CASCADE"), primary_key=True
    ),
    # unique (execution_id, seq): two decisions can never append the same position
    Column("seq", Integer, primary_key=True),
    Column("type", String(40), nullable=False),
    Column("data", Json, nullable=False),
    Column("recorded_at", Ts, nullable=False),
)

activity_tasks = Table(
    "harvest_activity_tasks",
    metadata,
    Column(
        "execution_id", String(200), ForeignKey("harvest_executions.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("activity_id", String(40), primary_key=True),
    Column("activity_name", String(200), nullable=False),
    Column("queue", String(200), nullable=False),
    # scheduled · running · retry_wait · completed · failed · cancelled · waiting (a limit)
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("retry", Json),
    Column("start_to_close", Float),
    Column("event_seq", Integer, nullable=False),  # its ActivityScheduled: the input lives there
    Column("worker_id", String(200)),
    Column("lease_expires_at", Ts),
    Column("due_at", Ts),
    Column("dispatched_at", Ts),
    Column("started_at", Ts),
    Column("finished_at", Ts),
    Column("last_error", Text),
    Column("compensation", Boolean, nullable=False, server_default="0"),
    Column("adopted", Boolean, nullable=False, server_default="0"),
    # how the adopted task is called with its input (``names.CallConvention``; NULL: its one
    # argument), as its ActivityScheduled records it (migration 0008)
    Column("call_convention", String(16)),
    # flow control (migration 0011, docs/flow-control.md): never part of event matching
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("limit_key", Json),  # the limit_key(input), a payload: codec, tombstoned by erasure
    Column("limit_digest", String(80)),  # its harvest_limits.key_digest; NULL: not limited
    Column("wait_seq", BigInteger),  # from harvest_wait_seq: FIFO within a priority
    Index("ix_harvest_activity_tasks_status", "status"),
    # the rows holding a slot (migration 0019): a settle counts them under its limit row's lock,
    # so the count reads only the limit's live rows, never the completed ones that only grow
    Index(
        "ix_harvest_activity_tasks_holding",
        "activity_name",
        "limit_digest",
        postgresql_where=sa_text(HOLDING_PREDICATE),
        sqlite_where=sa_text(HOLDING_PREDICATE),
    ),
    status_check("harvest_activity_tasks", TASK_STATUSES),
)
# each limit and key's waiting rows in their wait order (``limits.WAIT_ORDER``; migration 0020):
# a release reads the first ones and stops, whatever the backlog, and no other status change of
# a task row writes to it
Index(
    "ix_harvest_activity_tasks_wait_order",
    activity_tasks.c.activity_name,
    activity_tasks.c.limit_digest,
    activity_tasks.c.compensation.desc(),
    activity_tasks.c.priority.desc(),
    activity_tasks.c.wait_seq,
    postgresql_where=sa_text(WAITING_PREDICATE),
    sqlite_where=sa_text(WAITING_PREDICATE),
)

# The wait order of limited rows (migration 0011; Postgres only: SQLite has one writer)
WAIT_SEQ = Sequence("harvest_wait_seq", metadata=metadata)
# The start order of runs waiting for admission (migration 0018; Postgres only, as above)
ADMISSION_SEQ = Sequence("harvest_admission_seq", metadata=metadata)

# One row per (limit name, key digest): key_digest "" is the name's own row, holding the declared
# values (synced from the decorators at worker start) and the override (``set_limit``).
limits = Table(
    "harvest_limits",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("key_digest", String(80), primary_key=True),
    Column("declared_concurrency", Integer),
    Column("declared_rate_limit", String(40)),
    Column("override_concurrency", Integer),
    Column("override_rate_limit", String(40)),
    Column("override_set_at", Ts),
    Column("in_use", Integer, nullable=False, server_default="0"),
    Column("tat", Ts),  # GCRA's theoretical arrival time, from clock_timestamp()
    Column("updated_at", Ts),
)

timers = Table(
    "harvest_timers",
    metadata,
    Column(
        "execution_id", String(200), ForeignKey("harvest_executions.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("timer_id", String(40), primary_key=True),
    Column("fire_at", Ts, nullable=False),
    Column("fired", Boolean, nullable=False, server_default="0"),
    Index("ix_harvest_timers_due", "fired", "fire_at"),
)

# Every failed attempt's error, and a failed workflow's own (activity_id "", attempt 0): the
# type in the clear, the message and traceback in ``detail``, a payload (codec, offload, erasure).
# The history is unchanged by it: the awaiting workflow still sees only the final outcome.
attempt_errors = Table(
    "harvest_attempt_errors",
    metadata,
    Column(
        "execution_id", String(200), ForeignKey("harvest_executions.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("activity_id", String(40), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("error_type", String(200), nullable=False),
    Column("detail", Json),
    Column("recorded_at", Ts, nullable=False),
)

# An accepted update (docs/concepts.md, "Updates"): written with its ``UpdateAccepted`` under the
# run's lock (migration 0017). The primary key makes concurrent calls with one id accept once;
# the outcome is the history's ``UpdateCompleted``, never a column here.
workflow_updates = Table(
    "harvest_workflow_updates",
    metadata,
    Column(
        "execution_id", String(200), ForeignKey("harvest_executions.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("update_id", String(200), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("accepted_at", Ts, nullable=False),
)

outbox = Table(
    "harvest_outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task_name", String(200), nullable=False),
    Column("queue", String(200), nullable=False),
    Column("args", Json, nullable=False),
    Column("headers", Json),
    Column("task_id", String(300), nullable=False),
    Column("created_at", Ts, nullable=False),
    # the row's run (migration 0006, backfilled): erasure deletes a run's rows by it; NULL on a
    # row an older build wrote during a rolling deploy (erasure derives it, as the backfill did)
    Column("execution_id", String(200)),
    Index("ix_harvest_outbox_created_at", "created_at"),
    Index("ix_harvest_outbox_execution_id", "execution_id"),
)

blobs = Table(
    "harvest_blobs",
    metadata,
    Column("key", String(400), primary_key=True),
    Column("store_id", String(100), nullable=False),
    Column("data", LargeBinary, nullable=False),
)

# A child's close, written in the child's own transaction (it never touches its parent's row);
# applied in the parent's transaction, right after the child's commit or by the sweeper, which
# appends ChildWorkflowClosed once per child id and deletes the notice (migration 0010).
child_notices = Table(
    "harvest_child_notices",
    metadata,
    Column("parent_id", String(200), primary_key=True),
    Column("child_id", String(200), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("result", Json),
    Column("error", Json),
    Column("created_at", Ts, nullable=False),
    Index("ix_harvest_child_notices_created_at", "created_at"),
)


# A durable schedule (docs/schedules.md). ``last_tick`` is the cursor: ticks after it are still
# to be considered; ``next_fire_at`` (the next tick plus its jitter) is what the firing pass
# selects on, NULL once the schedule has ended. The input is a payload (codec, offload). A
# backfill in progress keeps its range and its cursor (the last tick it started), so a killed one
# resumes there. A schedule's ``target`` is a workflow, or an adopted Celery task (import-beat):
# then ``workflow`` names the task, ``queue`` is the task's queue (NULL: the adopted
# definition's) and the input is the call ``{"args", "kwargs"}``; each tick starts the built-in
# ``harvest.start_task`` run.
schedules = Table(
    "harvest_schedules",
    metadata,
    Column("name", String(180), primary_key=True),
    Column("workflow", String(200), nullable=False),
    Column("decision_queue", String(200), nullable=False),
    Column("cron", String(200)),
    Column("every_seconds", Integer),
    Column("timezone", String(64), nullable=False),
    Column("jitter_seconds", Float, nullable=False),
    Column("overlap", String(20), nullable=False),
    Column("catchup_seconds", Float, nullable=False),
    Column("end_at", Ts),
    Column("max_runs", Integer),
    Column("input", Json),
    Column("input_digest", String(80)),
    Column("spec_version", Integer, nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("pause_note", Text),
    Column("last_tick", Ts, nullable=False),
    Column("next_fire_at", Ts),
    Column("buffered_tick", Ts),
    Column("last_run_id", String(200)),
    Column("backfill_from", Ts),
    Column("backfill_to", Ts),
    Column("backfill_cursor", Ts),
    Column("runs", Integer, nullable=False),
    Column("fired", Integer, nullable=False),
    Column("skipped", Integer, nullable=False),
    Column("missed", Integer, nullable=False),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    Column("target", String(16), nullable=False, server_default="workflow"),
    Column("queue", String(200)),
    Index("ix_harvest_schedules_due", "decision_queue", "next_fire_at"),
)
