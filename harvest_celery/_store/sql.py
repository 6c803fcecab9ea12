"""Every raw SQL statement of the store, in one place: the one-statement claim and finish
(``tasks``), the run write's plain and guarded texts (``pgwrite`` caches them by shape), the
notifications, and the start written on an application's DB-API connection (``dbapi``).

Everything else is SQLAlchemy Core, written once for both dialects. These are Postgres-only (data-
modifying CTEs, ``pg_notify``); SQLite takes the same steps one by one, and how the two differ is
decided by the ``Dialect`` subclasses (``_store.dialect``), nowhere else. Table names come from
``_store.schema``, statuses and event types from their constants, and the run-state guards from
the predicates (``_store.predicates``): nothing here spells a status or a guard out by hand.

Parameters: ``sa.text`` statements take ``:name``; the texts sent with ``exec_driver_sql`` or a
DB-API cursor take ``%(name)s``.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._core.names import TaskStatus
from harvest_celery._payloads.fields import EXECUTION_PAYLOAD_COLUMNS
from harvest_celery._store.predicates import TASK, accepts_results, colon, fast_path, literal, unindexed
from harvest_celery._store.schema import activity_tasks, blobs, events, executions, limits, metadata, timers

DIALECT = postgresql.psycopg2.dialect()  # type: ignore[attr-defined]

RUNS_CHANNEL = "harvest_runs"  # a run's waiters: notified when it closes or settles
STARTS_CHANNEL = "harvest_runs_started"  # a start made in an application's transaction
DUES_CHANNEL = "harvest_limits_due"  # a rate limit's next token time, written (``_store.rates``)

RUNS, TASKS, EVENTS, TIMERS, BLOBS = (
    executions.name,
    activity_tasks.name,
    events.name,
    timers.name,
    blobs.name,
)
SCHEDULED, RUNNING_TASK, RETRY_WAIT, COMPLETED_TASK, CANCELLED_TASK, WAITING = (
    literal(s.value)
    for s in (
        TaskStatus.SCHEDULED,
        TaskStatus.RUNNING,
        TaskStatus.RETRY_WAIT,
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
        TaskStatus.WAITING,
    )
)
STARTED = literal(ev.ActivityStarted.type)

# Shape of a run write (``pgwrite``): per table its name, columns and row count; the run columns set.
Shape = tuple[tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]]


# ── pings and notifications ──────────────────────────────────────────────────────────────────
PING = "SELECT 1"  # the database answers (a pooled connection idle too long, ``Store.ping``)
# a query's read (``Store.snapshot``): the run row and its history from one snapshot, and the
# server refuses any write in it
READ_ONLY_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
LISTEN_RUNS = f"LISTEN {RUNS_CHANNEL}"
LISTEN_STARTS = f"LISTEN {STARTS_CHANNEL}"
LISTEN_DUES = f"LISTEN {DUES_CHANNEL}"
NOTIFY = sa.text(f"SELECT pg_notify({literal(RUNS_CHANNEL)}, :execution_id)")
ANNOUNCE = sa.text(f"SELECT pg_notify({literal(STARTS_CHANNEL)}, :notice)")
# the payload: the due time as seconds since the epoch (the wakers compare it with their own)
NOTIFY_DUE = sa.text(f"SELECT pg_notify({literal(DUES_CHANNEL)}, :due)")


# ── the claim and the finish (``tasks``), one statement each ─────────────────────────────────
# Lock the run (``accepts_results``), take the task row only if it is scheduled at this attempt,
# append ActivityStarted at the run's next seq, bump next_seq, and return the input (and the
# recorded time) of the row's ActivityScheduled event. No row back means refused.
# Here and in every key lookup below, the task row is named by its full key from parameters
# (not only through the join to the locked run) and a status is compared ``unindexed``: a
# prepared plan made on a young table otherwise keeps reading a status index's whole range.
CLAIM = sa.text(f"""
WITH run AS (
    SELECT id, next_seq FROM {RUNS}
    WHERE id = :execution_id AND {accepts_results.sql(None, colon)}
    FOR UPDATE
), task AS (
    UPDATE {TASKS} AS t
    SET status = {RUNNING_TASK}, worker_id = :worker_id, started_at = :now,
        lease_expires_at = CAST(:now AS TIMESTAMPTZ) + make_interval(secs => COALESCE(t.start_to_close, :lease) + 5)
    FROM run
    WHERE t.execution_id = :execution_id AND t.activity_id = :activity_id AND t.execution_id = run.id
      AND {unindexed("t.status")} = {SCHEDULED} AND t.attempt = :attempt
    RETURNING t.activity_name, t.start_to_close, t.event_seq, t.queue
), started AS (
    INSERT INTO {EVENTS} (execution_id, seq, type, data, recorded_at)
    SELECT run.id, run.next_seq, {STARTED}, CAST(:data AS JSONB), :now FROM run, task
    RETURNING seq
), bumped AS (
    UPDATE {RUNS} AS e SET next_seq = started.seq + 1, updated_at = :now
    FROM started WHERE e.id = :execution_id
)
SELECT task.activity_name, task.start_to_close, task.queue, started.seq AS started_seq,
       s.data AS scheduled, s.recorded_at AS scheduled_at
FROM task CROSS JOIN started
LEFT JOIN {EVENTS} AS s ON s.execution_id = :execution_id AND s.seq = task.event_seq
""")

# The run row as a lock reads it (``Tx.lock``): every column but the payload ones (``input``,
# ``result``, ``limit_key``); a canvas run's graph makes its input as large as the canvas.
RUN_ROW = ", ".join(c.name for c in executions.c if c.name not in EXECUTION_PAYLOAD_COLUMNS)

# A completion's cold read (``tasks.read_cold``), one autocommit statement: the run row WITHOUT a
# lock and its history from ``:since`` (0, or where a replay kept here stopped) to before
# ``:before`` (the attempt's ActivityStarted), one row per event (the run row's columns repeated;
# a run without events in that range gives one row, its event columns NULL).
# A stale read costs nothing: the guarded write re-checks everything under the run row's lock.
COLD_READ = sa.text(f"""
SELECT {", ".join(f"r.{c}" for c in RUN_ROW.split(", "))},
       e.seq AS ev_seq, e.data AS ev_data, e.recorded_at AS ev_recorded_at
FROM {RUNS} AS r
LEFT JOIN {EVENTS} AS e ON e.execution_id = r.id AND e.seq >= :since AND e.seq < :before
WHERE r.id = :execution_id
ORDER BY e.seq
""")

# Lock the run and mark its task row completed (``tasks.accepts_completion``); the run row comes
# back (without its payload columns) with whether the task row was still open (False: a
# duplicate completion).
FINISH = sa.text(f"""
WITH run AS (
    SELECT {RUN_ROW} FROM {RUNS} WHERE id = :execution_id FOR UPDATE
), prev AS (
    SELECT t.execution_id, t.activity_id, t.status IN ({SCHEDULED}, {RUNNING_TASK}) AS held
    FROM {TASKS} AS t JOIN run ON t.execution_id = run.id
    WHERE t.execution_id = :execution_id AND t.activity_id = :activity_id
    FOR UPDATE OF t
), task AS (
    UPDATE {TASKS} AS t
    SET status = {COMPLETED_TASK}, finished_at = :now, lease_expires_at = NULL
    FROM run, prev
    WHERE t.execution_id = :execution_id AND t.activity_id = :activity_id AND t.execution_id = run.id
      AND prev.execution_id = t.execution_id AND prev.activity_id = t.activity_id
      AND ((t.attempt = :attempt AND t.status IN ({RUNNING_TASK}, {RETRY_WAIT}))
           OR (t.attempt = :attempt + 1 AND t.status IN ({SCHEDULED}, {WAITING}))
           OR (t.status = {CANCELLED_TASK} AND t.attempt IN (:attempt, :attempt + 1)
               AND run.cancelled_at IS NOT NULL
               AND EXISTS (SELECT 1 FROM {EVENTS} AS s
                           WHERE s.execution_id = run.id AND s.type = {STARTED}
                             AND s.data->>'activity_id' = :activity_id
                             AND s.data->>'attempt' = CAST(:attempt AS TEXT))))
    RETURNING t.activity_id, t.activity_name, t.limit_digest, prev.held
)
SELECT run.*, EXISTS (SELECT 1 FROM task) AS finished,
       (SELECT activity_name FROM task) AS task_name, (SELECT limit_digest FROM task) AS task_limit,
       COALESCE((SELECT held FROM task), false) AS task_held
FROM run
""")


# ── a limit's settle (``_store.limits``) ─────────────────────────────────────────────────────
LIMITS = limits.name

# A limit row, created on its first use (a key's row appears on its first dispatch). Only when
# the snapshot has none: ON CONFLICT on an existing row would wait for the transaction holding
# its lock (it has updated the row), before the lock's own queue.
ENSURE_LIMIT = f"""INSERT INTO {LIMITS} (name, key_digest, in_use)
SELECT CAST(%(name)s AS VARCHAR), CAST(%(digest)s AS VARCHAR), 0
WHERE NOT EXISTS (SELECT 1 FROM {LIMITS} WHERE name = %(name)s AND key_digest = %(digest)s)
ON CONFLICT DO NOTHING"""

# Lock a limit row (``limits.settle``): its GCRA ``tat`` and the database's clock.
LOCK_LIMIT = f"""SELECT tat, clock_timestamp() AS clock FROM {LIMITS}
WHERE name = %(name)s AND key_digest = %(digest)s FOR UPDATE"""

# A settle under a concurrency limit, sent right after LOCK_LIMIT took the limit row's lock: a
# new statement, so its snapshot sees every slot the lock's previous holders took or released.
# Recount the limit's scheduled and running rows, release the next waiting ones that fit
# (compensations, priority, FIFO; SKIP LOCKED), store in_use, in ONE round trip. With a rate in
# force it releases and stores nothing (``rate`` comes back set: the caller takes the rate's
# steps from ``tat`` and ``clock``, read with the lock). One row at least comes back: ``rate``,
# ``tat``, ``clock``, then each released row's columns (NULL: none released).
# The released row the deciding thread wants (``c_run``/``c_act``, attempt 1; NULL: none) is
# claimed for it in the same statement (``limits.take_eagerly``'s steps): ``running`` under its
# lease, ``ActivityStarted`` appended at its run's next seq (the run row is this transaction's
# own, locked first), that seq returned as ``started_seq`` (``taken`` marks its row).
_MINE = "(t.execution_id = %(c_run)s AND t.activity_id = %(c_act)s AND t.attempt = 1)"
# Release the rows ``nxt`` locked (``scheduled``; the deciding thread's own row ``running``, its
# ActivityStarted appended at its run's next seq, ``taken``): the settle's and the hand-off's.
_RELEASE = f"""), rel AS (
    UPDATE {TASKS} AS t SET status = CASE WHEN {_MINE} THEN {RUNNING_TASK} ELSE {SCHEDULED} END,
        worker_id = CASE WHEN {_MINE} THEN %(c_worker)s ELSE t.worker_id END,
        started_at = CASE WHEN {_MINE} THEN CAST(%(c_at)s AS TIMESTAMPTZ) ELSE t.started_at END,
        lease_expires_at = CASE WHEN {_MINE} THEN CAST(%(c_lease)s AS TIMESTAMPTZ)
                                ELSE t.lease_expires_at END,
        dispatched_at = %(now)s, due_at = NULL
    FROM nxt WHERE t.execution_id = nxt.execution_id AND t.activity_id = nxt.activity_id
    RETURNING t.execution_id, t.activity_id, t.activity_name, t.queue, t.attempt, t.adopted,
              t.start_to_close, t.priority, t.status = {RUNNING_TASK} AS taken
), bumped AS (
    UPDATE {RUNS} AS r SET next_seq = r.next_seq + 1 FROM rel
    WHERE rel.taken AND r.id = rel.execution_id
    RETURNING r.id, r.next_seq - 1 AS seq
), began AS (
    INSERT INTO {EVENTS} (execution_id, seq, type, data, recorded_at)
    SELECT bumped.id, bumped.seq, {STARTED}, CAST(%(c_data)s AS JSONB), CAST(%(c_at)s AS TIMESTAMPTZ)
    FROM bumped
    RETURNING seq
"""
SETTLE_CONCURRENCY = f"""
WITH cfg AS (
    SELECT COALESCE(override_concurrency, declared_concurrency) AS lim,
           COALESCE(override_rate_limit, declared_rate_limit) AS rate
    FROM {LIMITS} WHERE name = %(name)s AND key_digest = ''
), held AS (
    SELECT count(*) AS n FROM {TASKS}
    WHERE activity_name = %(name)s AND limit_digest = %(digest)s AND status IN ({SCHEDULED}, {RUNNING_TASK})
), fits AS (
    SELECT CASE WHEN cfg.rate IS NOT NULL THEN 0
                WHEN cfg.lim IS NULL THEN NULL
                ELSE GREATEST(0, cfg.lim - held.n) END AS free
    FROM held LEFT JOIN cfg ON true
), nxt AS (
    SELECT execution_id, activity_id FROM {TASKS}
    WHERE activity_name = %(name)s AND limit_digest = %(digest)s AND status = {WAITING}
    ORDER BY compensation DESC, priority DESC, wait_seq
    LIMIT (SELECT free FROM fits)
    FOR UPDATE SKIP LOCKED
{_RELEASE}), stored AS (
    UPDATE {LIMITS} SET in_use = (SELECT n FROM held) + (SELECT count(*) FROM rel), updated_at = %(now)s
    WHERE name = %(name)s AND key_digest = %(digest)s AND NOT EXISTS (SELECT 1 FROM cfg WHERE rate IS NOT NULL)
)
SELECT (SELECT rate FROM cfg) AS rate, l.tat, clock_timestamp() AS clock, rel.*,
       (SELECT seq FROM began) AS started_seq
FROM {LIMITS} AS l LEFT JOIN rel ON true WHERE l.name = %(name)s AND l.key_digest = %(digest)s"""

# A concurrency settle: the row, its lock, the settle (``Dialect.in_one_trip``: one round trip with
# psycopg2; each statement its own snapshot, so the settle's is taken once the lock is held).
SETTLE_STEPS = (ENSURE_LIMIT, LOCK_LIMIT, SETTLE_CONCURRENCY)


# A hand-off (``limits.hand_off``): a transaction that took ``freed`` rows of a limit out of
# ``scheduled``/``running`` gives their slots to the next waiting rows, WITHOUT the limit row's
# lock: the count of rows holding a slot is the same before and after it commits, whatever any
# other settle reads meanwhile, so no recount is needed and commits never queue behind one
# another on a hot limit row. Only under a concurrency limit with no rate in force, and only
# while the key's stored ``in_use`` is within the limit (a lowered limit must shrink: the
# locked settle's). Returns the released rows; fewer than ``freed``: the caller settles the
# rest under the lock (a slot nobody takes now lowers the count, which a waiting row's settle
# must see).
def _hand_off(name: str, digest: str, freed: str) -> str:
    return f"""cfg AS (
    SELECT COALESCE(override_concurrency, declared_concurrency) AS lim,
           COALESCE(override_rate_limit, declared_rate_limit) AS rate
    FROM {LIMITS} WHERE name = {name} AND key_digest = ''
), ok AS (
    SELECT 1 FROM cfg, {LIMITS} AS l
    WHERE l.name = {name} AND l.key_digest = {digest}
      AND cfg.rate IS NULL AND cfg.lim IS NOT NULL AND l.in_use <= cfg.lim
), nxt AS (
    SELECT execution_id, activity_id FROM {TASKS}
    WHERE activity_name = {name} AND limit_digest = {digest} AND status = {WAITING}
      AND EXISTS (SELECT 1 FROM ok)
    ORDER BY compensation DESC, priority DESC, wait_seq
    LIMIT {freed}
    FOR UPDATE SKIP LOCKED
{_RELEASE})"""


HAND_OFF = f"""WITH {_hand_off("%(name)s", "%(digest)s", "%(freed)s")}
SELECT rel.*, (SELECT seq FROM began) AS started_seq FROM rel"""

# The hand-off of the slot a limited attempt held, sent after its guarded one-statement write
# (``sql.guarded_write``) in the same simple query, so in the same implicit transaction
# (``Tx.apply_guarded_decision``): its limit is read from the task row that write completed in
# this very transaction (``xmin``), so nothing is handed on when the guard refused the write.
# One row always comes back: the limit's name and digest (NULL: not written), then the released
# row's columns (NULL: none).
HAND_OFF_AFTER_WRITE = f"""WITH me AS (
    SELECT activity_name AS name, limit_digest AS digest FROM {TASKS}
    WHERE execution_id = %(run_id)s AND activity_id = %(g_activity_id)s
      AND {unindexed("status")} = {COMPLETED_TASK} AND xmin = xid(pg_current_xact_id_if_assigned())
), {_hand_off("(SELECT name FROM me)", "(SELECT digest FROM me)", "1")}
SELECT me.name AS limit_name, me.digest AS limit_digest, rel.*, (SELECT seq FROM began) AS started_seq
FROM (SELECT 1) AS one LEFT JOIN me ON true LEFT JOIN rel ON true"""


# A workflow admission's settle (``admission.settle``), sent right after LOCK_LIMIT took the key's
# limit row: recount the key's admitted runs still RUNNING, admit the next waiting ones that fit
# (priority, then ``admission_seq``; paused ones passed over; SKIP LOCKED: the own run row is
# this transaction's), store in_use. Returns the admitted runs (id, decision_queue, has_held).
# ``name`` and ``digest``: SQL for the key (parameters, or the closing run's columns); ``defer``:
# admit nothing when a run it would admit has held rows (``limits.release_held`` is Python's).
def _settle_admission(name: str, digest: str, *, defer: bool = False) -> str:
    held_rows = f"SELECT 1 FROM {TASKS} AS t WHERE t.execution_id = nxt.id AND t.status = {WAITING}"
    deferred = f"EXISTS (SELECT 1 FROM nxt WHERE EXISTS ({held_rows} AND t.limit_digest IS NULL))"
    return f"""
WITH cfg AS (
    SELECT COALESCE(override_concurrency, declared_concurrency) AS lim
    FROM {LIMITS} WHERE name = {name} AND key_digest = ''
), held AS (
    SELECT count(*) AS n FROM {RUNS}
    WHERE workflow_type = {name} AND limit_digest = {digest} AND admitted_at IS NOT NULL
      AND status = {literal(RUNNING)}
), fits AS (
    SELECT COALESCE(GREATEST(0, cfg.lim - held.n), 0) AS free FROM held LEFT JOIN cfg ON true
), nxt AS (
    SELECT id FROM {RUNS}
    WHERE workflow_type = {name} AND limit_digest = {digest} AND admitted_at IS NULL
      AND status = {literal(RUNNING)} AND paused_at IS NULL
    ORDER BY priority DESC, admission_seq
    LIMIT (SELECT free FROM fits)
    FOR UPDATE SKIP LOCKED
), deferred AS (
    SELECT {deferred if defer else "false"} AS d
), adm AS (
    UPDATE {RUNS} AS r SET admitted_at = %(now)s, decision_requested_at = %(now)s, updated_at = %(now)s
    FROM nxt, deferred WHERE r.id = nxt.id AND NOT deferred.d
    RETURNING r.id, r.decision_queue
), stored AS (
    UPDATE {LIMITS} SET in_use = (SELECT n FROM held) + (SELECT count(*) FROM adm), updated_at = %(now)s
    WHERE name = {name} AND key_digest = {digest}
)"""


SETTLE_ADMISSION = (
    _settle_admission("%(name)s", "%(digest)s")
    + f"""
SELECT id, decision_queue, EXISTS (
    SELECT 1 FROM {TASKS} AS t
    WHERE t.execution_id = adm.id AND t.status = {WAITING} AND t.limit_digest IS NULL
) AS has_held FROM adm"""
)

# An admission settle: the key's row, its lock, the settle, in one round trip with psycopg2
# (``Dialect.in_one_trip``: the settle's snapshot is taken once the lock is held).
ADMISSION_STEPS = (ENSURE_LIMIT, LOCK_LIMIT, SETTLE_ADMISSION)

# The same steps after a guarded write that closes a limited workflow's run (``admission.
# close_in_one_trip``), in the same simple query: one implicit transaction, one round trip, in
# the one lock order (the run row, locked by the write; the key's limit row; the waiting runs'
# rows, SKIP LOCKED). The key is the closing run's own (its stored ``limit_digest``: a
# continue-as-new link's is inherited, never recomputed), read only if THIS transaction wrote
# the row (``xmin``): a refused write leaves every step without a key, a no-op. The last
# statement says whether the write happened (no row: refused), the key, whether the admission
# was deferred (a run it would admit has held rows: settled by a transaction of its own), and
# the admitted runs (id NULL: none).
_CLOSED_HERE = f"""{RUNS} WHERE id = %(run_id)s AND limit_digest IS NOT NULL
      AND xmin = pg_current_xact_id_if_assigned()::xid"""
_NAME = f"(SELECT workflow_type FROM {_CLOSED_HERE})"
_DIGEST = f"(SELECT limit_digest FROM {_CLOSED_HERE})"
ADMISSION_CLOSE_STEPS = (
    ENSURE_LIMIT.replace("%(name)s", _NAME)
    .replace("%(digest)s", _DIGEST)
    .replace("WHERE NOT EXISTS", f"WHERE {_NAME} IS NOT NULL AND NOT EXISTS"),
    LOCK_LIMIT.replace("%(name)s", _NAME).replace("%(digest)s", _DIGEST),
    _settle_admission(_NAME, _DIGEST, defer=True)
    + f"""
SELECT m.workflow_type AS name, m.limit_digest AS digest, (SELECT d FROM deferred) AS deferred,
       adm.id, adm.decision_queue
FROM {RUNS} AS m LEFT JOIN adm ON true
WHERE m.id = %(run_id)s AND m.xmin = pg_current_xact_id_if_assigned()::xid""",
)


# ── a run write as one statement (``pgwrite``), its text built once per shape ────────────────
def _guard_param(name: str) -> str:
    return f"%(g_{name})s"


# ``fast_path``: the run row locked only if it is as the warm replay assumes, the attempt's task
# row closed only if that attempt still owns it; everything after reads ``done``.
GUARD = f"""run AS (
    SELECT id FROM {RUNS}
    WHERE id = %(run_id)s AND {fast_path.sql(None, _guard_param)}
    FOR UPDATE
), done AS (
    UPDATE {TASKS} AS t
    SET status = {COMPLETED_TASK}, finished_at = %(g_now)s, lease_expires_at = NULL
    FROM run
    WHERE t.execution_id = %(run_id)s AND t.activity_id = %(g_activity_id)s AND t.execution_id = run.id
      AND {fast_path.sql("t", _guard_param, table=TASK)}
    RETURNING t.execution_id
)"""

CLOSING = f"""abandoned AS (
    UPDATE {TASKS} AS a
    SET status = {CANCELLED_TASK}, finished_at = %(g_closed_at)s, last_error = %(g_why)s
    FROM done WHERE a.execution_id = done.execution_id
      AND a.status IN ({SCHEDULED}, {RETRY_WAIT}, {WAITING})
), stopped AS (
    UPDATE {TIMERS} AS tm SET fired = true FROM done WHERE tm.execution_id = done.execution_id
)"""
NOTIFY_DONE = f"notified AS (SELECT pg_notify({literal(RUNS_CHANNEL)}, %(run_id)s) FROM done)"


@lru_cache(maxsize=256)
def plain_write(shape: Shape) -> str:
    """The inserts as data-modifying CTEs of the run-row UPDATE."""
    tables, columns = shape
    ctes = []
    for t, (table, names, count) in enumerate(tables):
        ctes.append(
            f"new_{table} AS (INSERT INTO {table} ({_columns(names)}) "
            f"VALUES {_rows(t, table, names, count, cast=False)})"
        )
    sets = ", ".join(f"{quote(n)} = %(v_{n})s" for n in columns) or "next_seq = next_seq"
    head = f"WITH {', '.join(ctes)} " if ctes else ""
    return f"{head}UPDATE {RUNS} SET {sets} WHERE id = %(run_id)s"


@lru_cache(maxsize=256)
def guarded_write(shape: Shape, closing: bool, notify: bool) -> str:
    """The same, written only if ``GUARD`` held (its row count is 1 when written, 0 when not)."""
    tables, columns = shape
    ctes = [GUARD] + ([CLOSING] if closing else []) + ([NOTIFY_DONE] if notify else [])
    for t, (table, names, count) in enumerate(tables):
        ctes.append(
            f"new_{table} AS (INSERT INTO {table} ({_columns(names)}) SELECT v.* FROM "
            f"(VALUES {_rows(t, table, names, count, cast=True)}) AS v, done)"
        )
    sets = ", ".join(f"{quote(n)} = %(v_{n})s" for n in columns) or "next_seq = e.next_seq"
    sources = "done, notified" if notify else "done"  # a plain CTE runs only if read
    return (
        f"WITH {', '.join(ctes)} UPDATE {RUNS} AS e SET {sets} FROM {sources} WHERE e.id = done.execution_id"
    )


def _type(table: str, column: str) -> str:
    """The column's type for a CAST in VALUES, without a length: an explicit cast to
    VARCHAR(n) would silently truncate, where the INSERT itself refuses an over-long value."""
    return re.sub(r"\(\d+\)", "", str(metadata.tables[table].c[column].type.compile(dialect=DIALECT)))


def _rows(t: int, table: str, names: tuple[str, ...], count: int, *, cast: bool) -> str:
    """``count`` VALUES rows of table ``t``'s parameters; cast to the column types where the
    rows stand in a SELECT (no INSERT target to coerce them)."""
    cells = [
        f"CAST(%(t{t}r{{r}}_{n})s AS {_type(table, n)})" if cast else f"%(t{t}r{{r}}_{n})s" for n in names
    ]
    return ", ".join("(" + ", ".join(cell.format(r=r) for cell in cells) + ")" for r in range(count))


def _columns(names: tuple[str, ...]) -> str:
    return ", ".join(quote(n) for n in names)


def quote(name: str) -> str:
    return str(DIALECT.identifier_preparer.quote(name))


# ── a start on an application's DB-API connection (``dbapi``) ────────────────────────────────
# The run row (ON CONFLICT: skipped if the id exists), its WorkflowStarted only if the row was
# new, and the announcement, delivered on commit.
START = f"""
WITH run AS (
    INSERT INTO {RUNS} (id, workflow_type, status, input, input_digest, next_seq,
                        created_at, updated_at, decision_requested_at, nd_block_count,
                        decision_queue)
    VALUES (%(id)s, %(workflow_type)s, %(status)s, CAST(%(input)s AS jsonb), %(digest)s, 1,
            %(now)s, %(now)s, %(now)s, 0, %(decision_queue)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), started AS (
    INSERT INTO {EVENTS} (execution_id, seq, type, data, recorded_at)
    SELECT id, 0, CAST(%(event_type)s AS varchar), CAST(%(event)s AS jsonb), %(now)s FROM run
    RETURNING execution_id
)
SELECT pg_notify({literal(STARTS_CHANNEL)}, %(notice)s) FROM started
"""


def _start_with_admission(waiting: bool) -> str:
    """``START`` with a run's admission columns (``_store.admission``): waiting (a limited
    workflow: no admitted_at, no decision request, its start order and key), or admitted with a
    start priority other than 0. Announced all the same."""
    requested, admitted = ("NULL", "NULL") if waiting else ("%(now)s", "%(now)s")
    return START.replace(
        "decision_queue)\n",
        "decision_queue, admitted_at, admission_seq, priority, limit_key, limit_digest)\n",
    ).replace(
        "%(now)s, %(now)s, %(now)s, 0, %(decision_queue)s)",
        f"%(now)s, %(now)s, {requested}, 0, %(decision_queue)s, {admitted},\n"
        f"            {'nextval(' + literal('harvest_admission_seq') + ')' if waiting else 'NULL'},"
        " %(priority)s, CAST(%(limit_key)s AS jsonb), %(limit_digest)s)",
    )


START_WAITING = _start_with_admission(waiting=True)
START_PRIORITY = _start_with_admission(waiting=False)
EXISTING = f"SELECT workflow_type, status, input_digest FROM {RUNS} WHERE id = %(id)s"
INPUT = f"SELECT CAST(input AS text) FROM {RUNS} WHERE id = %(id)s"
BLOB = f"""
INSERT INTO {BLOBS} (key, store_id, data) VALUES (%(key)s, %(store_id)s, %(data)s)
ON CONFLICT (key) DO UPDATE SET store_id = EXCLUDED.store_id, data = EXCLUDED.data
"""
