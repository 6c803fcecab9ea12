"""Concurrency slots and rate tokens, enforced in Postgres for every worker (docs/flow-control.md).

A limited dispatch is written ``waiting`` with no message (``staging.task_row``); the
transaction that wrote it, and every transaction that frees a slot of its limit, *touches* the
limit (``Tx.touch_limit``); just before it commits, ``settle`` runs for each limit it touched,
in (name, key digest) order:

1. lock the limit row (created on first use): after the transaction's own run row, always,
   reading its GCRA ``tat`` and the database's clock with the lock;
2. count the limit's ``scheduled`` and ``running`` rows: that is ``in_use`` (a slot is held from
   the moment a row leaves ``waiting`` until it completes, fails, waits for a retry, is
   abandoned or its lease expires), stored back on the row, so the invariant holds by
   construction after every settle;
3. move the next waiting rows on, compensations first, then priority descending, then
   ``wait_seq`` (FIFO within a priority), locked ``FOR UPDATE SKIP LOCKED``: a release never
   waits for another run's lock, and changes only those rows' status and ``dispatched_at``;
   their messages are staged and sent after commit. Under a rate limit at most one row moves,
   and only with a token; the next row whose turn has come gets the token's due time, which a
   sweeper's waker keeps (``_store.rates``). A released row the deciding thread wants
   (``Tx.eager_take``: a new limited row of this transaction's decision) is claimed for it
   instead (``take_eagerly``): its slot and token were taken in this very write, so it runs
   eagerly; a row that is not released waits, and the thread gets nothing.

On Postgres, under a concurrency limit, steps 2 and 3 are one statement sent right after the
lock, in the same round trip with psycopg2 (``sql.SETTLE_STEPS``): a statement of its own, so
its snapshot, taken once the lock is held, sees every slot the lock's previous holders took or
freed. The lock is then held for one round trip and the commit, with no Python work between
statements: every limited step settles the one row of its (name, key) twice (its dispatch and
its completion), so that window bounds a hot limit's steps per second. Under a rate, and on
SQLite, the steps go one by one.

Freeing a slot without the lock (a completion marks its row completed first) only lowers the
count the next settle sees: the limit errs toward fewer starts, never more. The sweeper settles
every limit with waiting rows each pass, the backstop for a process that died between commit and
send.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from harvest_celery._core import events as ev
from harvest_celery._core.limits import Limits, RateLimit
from harvest_celery._core.names import TaskStatus
from harvest_celery._core.registry import Registry
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._store import rates, sql
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.records import Dispatch
from harvest_celery._store.schema import WAIT_SEQ, activity_tasks, events, executions, limits
from harvest_celery._store.staging import EagerTake


class Tx(Protocol):
    """What a settle needs of its transaction (``_store.tx.Tx``): its connection and dialect,
    and the messages it sends after commit."""

    conn: Connection
    dialect: Dialect
    amounts: list[tuple[str, dict[str, str], float]]
    payloads: Any
    dispatches: list[Dispatch]
    eager_take: EagerTake | None
    freed: dict[tuple[str, str], int]
    autocommit: bool

    def dispatch_activity(
        self,
        execution_id: str,
        activity_id: str,
        name: str,
        queue: str,
        attempt: int,
        adopted: bool,
        deadline: float | None,
        *,
        priority: int = 0,
        call_convention: str | None = None,
    ) -> None: ...


HOLDING = (TaskStatus.SCHEDULED.value, TaskStatus.RUNNING.value)
NAME_ROW = ""  # key_digest of the name's own row: declared and override values


def _of(name: str, digest: str) -> sa.ColumnElement[bool]:
    return (activity_tasks.c.activity_name == name) & (activity_tasks.c.limit_digest == digest)


def ensure(tx: Tx, name: str, digest: str) -> None:
    """The limit row exists (a key's row appears on its first dispatch)."""
    tx.conn.execute(tx.dialect.insert_ignore(limits).values(name=name, key_digest=digest, in_use=0))


def in_force(tx: Tx, name: str) -> tuple[int | None, RateLimit | None]:
    """The concurrency and rate in force: each the override, else the declared value (None:
    no such limit)."""
    found = tx.conn.execute(
        sa.select(
            limits.c.declared_concurrency,
            limits.c.override_concurrency,
            limits.c.declared_rate_limit,
            limits.c.override_rate_limit,
        ).where((limits.c.name == name) & (limits.c.key_digest == NAME_ROW))
    ).first()
    if found is None:
        return None, None
    concurrency = (
        found.override_concurrency if found.override_concurrency is not None else found.declared_concurrency
    )
    return concurrency, rates.in_force(found.declared_rate_limit, found.override_rate_limit)


def _locked(tx: Tx, name: str, digest: str, *, skip_locked: bool = False) -> sa.Row[Any] | None:
    """Lock the limit row; with it, its ``tat`` and the database's clock (GCRA's time)."""
    return tx.conn.execute(
        tx.dialect.lock(
            sa.select(limits.c.tat, tx.dialect.clock().label("clock")).where(
                (limits.c.name == name) & (limits.c.key_digest == digest)
            ),
            skip_locked=skip_locked,
        )
    ).first()


def settle(tx: Tx, name: str, digest: str, now: datetime) -> int:
    """Recount the limit's slots and release what fits (see the module); the rows released."""
    return tx.dialect.one_statement(_settle_in_one, _settle_stepwise)(tx, name, digest, now)


def _settle_in_one(tx: Tx, name: str, digest: str, now: datetime) -> int:
    """Postgres: under a concurrency limit the whole settle is one statement sent right after
    the lock (``sql.SETTLE_STEPS``), in the same round trip with psycopg2: the lock is held for
    that round trip and the commit, with no Python work between statements."""
    params = {"name": name, "digest": digest, "now": now, **candidate(tx.eager_take)}
    freed = tx.freed.pop((name, digest), 0)
    if freed:
        handed = hand_off(tx, params, freed)
        if handed == freed:
            return handed
        params.update(candidate(tx.eager_take))  # the deciding thread's row may be gone
    released = tx.dialect.in_one_trip(tx.conn, sql.SETTLE_STEPS, params).all()
    if released[0].rate is not None:  # a rate in force: its steps, under the lock held
        if tx.autocommit:  # the trip's implicit transaction ended: it released nothing
            raise NeedsTransaction(name)
        return _settle_locked(tx, name, digest, released[0], now)
    return dispatch_released(tx, [row for row in released if row.execution_id is not None])


def hand_off(tx: Tx, params: dict[str, Any], freed: int) -> int:
    """Give the slots this transaction freed to the next waiting rows, without the limit row's
    lock (``sql.HAND_OFF``: the count of rows holding a slot does not change): the rows released.
    Fewer than ``freed`` (no one waits, a rate is in force, the limit was lowered): the caller
    settles under the lock, which recounts."""
    released = tx.conn.exec_driver_sql(sql.HAND_OFF, {**params, "freed": freed}).all()
    return dispatch_released(tx, list(released))


class NeedsTransaction(Exception):
    """A settle sent in autocommit (``Store._settle_after``) found a rate in force: its steps
    need the lock held across statements, so it is settled again in a transaction."""


def candidate(taking: EagerTake | None) -> dict[str, Any]:
    """``SETTLE_CONCURRENCY``'s parameters of the row the deciding thread wants (all None: none)."""
    if taking is None:
        return dict.fromkeys(("c_run", "c_act", "c_worker", "c_at", "c_lease", "c_data"))
    c = taking.claim
    started = ev.ActivityStarted(c.activity_id, c.attempt, c.worker_id).to_data()
    return {
        "c_run": c.execution_id,
        "c_act": c.activity_id,
        "c_worker": c.worker_id,
        "c_at": c.started_at,
        "c_lease": taking.lease_expires_at,
        "c_data": json.dumps(started),
    }


def _settle_stepwise(tx: Tx, name: str, digest: str, now: datetime) -> int:
    ensure(tx, name, digest)
    held = _locked(tx, name, digest)
    assert held is not None
    return _settle_locked(tx, name, digest, held, now)


def wake(tx: Tx, name: str, digest: str, now: datetime) -> int | None:
    """A waker's settle at a due time (``_runtime.waker``): the limit row locked with SKIP
    LOCKED, so two wakers never spend one token twice; None when another transaction holds it
    (that one settles it)."""
    held = _locked(tx, name, digest, skip_locked=True)
    if held is None:
        return None
    return _settle_locked(tx, name, digest, held, now)


def _settle_locked(tx: Tx, name: str, digest: str, held: sa.Row[Any], now: datetime) -> int:
    in_use = tx.conn.execute(
        sa.select(sa.func.count())
        .select_from(activity_tasks)
        .where(_of(name, digest) & activity_tasks.c.status.in_(HOLDING))
    ).scalar_one()
    limit, rate = in_force(tx, name)
    free = None if limit is None else max(0, limit - in_use)
    values: dict[str, Any] = {}
    if rate is not None:
        token = rates.release(tx, name, digest, free, rate, held.tat, held.clock, WAIT_ORDER)
        released, values["tat"] = token.released, token.tat
        if token.released:
            tx.amounts.append(("limit_throttled", {"limit": name}, token.throttled))
    else:
        released = _release(tx, name, digest, free) if free is None or free > 0 else []
    for row in released:
        tx.conn.execute(
            activity_tasks.update()
            .where(
                (activity_tasks.c.execution_id == row.execution_id)
                & (activity_tasks.c.activity_id == row.activity_id)
            )
            .values(status=TaskStatus.SCHEDULED.value, dispatched_at=now, due_at=None)
        )
    tx.conn.execute(
        limits.update()
        .where((limits.c.name == name) & (limits.c.key_digest == digest))
        .values(in_use=in_use + len(released), updated_at=now, **values)
    )
    return dispatch_released(tx, released)


def dispatch_released(tx: Tx, released: list[sa.Row[Any]]) -> int:
    """The released rows' messages, staged (sent after commit); the row the deciding thread
    wants (``Tx.eager_take``), released in this very transaction, is claimed for it instead."""
    taking = tx.eager_take
    for row in released:
        if taking is not None and (row.execution_id, row.activity_id) == taking.key and row.attempt == 1:
            tx.eager_take = None
            taken = getattr(row, "started_seq", None)  # taken by the settle statement itself
            take_eagerly(tx, taking, taken)
            continue
        tx.dispatch_activity(
            row.execution_id,
            row.activity_id,
            row.activity_name,
            row.queue,
            row.attempt,
            row.adopted,
            row.start_to_close,
            priority=row.priority,
        )
    return len(released)


def release_held(tx: Tx, execution_id: str, now: datetime) -> None:
    """A run just admitted (``_store.admission``): its *held* rows go on. A reset whose new run
    waits for admission writes the activities it re-dispatches held (``Tx.insert_task(held=
    True)``: WAITING under no limit, so no settle releases them, and no message). An unlimited
    one (no ``wait_seq``) is SCHEDULED and its message staged; a limited one gets back its
    limit's digest and waits in its line, released by that limit's next settle (the sweeper's
    pass at the latest: settling it here would lock an activity's limit row after the
    workflow's, against the one lock order)."""
    t = activity_tasks.c
    rows = tx.conn.execute(
        sa.select(t.activity_id, t.activity_name, t.queue, t.attempt, t.adopted)
        .add_columns(t.start_to_close, t.call_convention, t.wait_seq, t.limit_key, t.priority)
        .where(
            (t.execution_id == execution_id)
            & (t.status == TaskStatus.WAITING.value)
            & t.limit_digest.is_(None)
        )
    ).all()
    for r in rows:
        which = (t.execution_id == execution_id) & (t.activity_id == r.activity_id)
        if r.wait_seq is not None:
            key = None if r.limit_key is None else tx.payloads.decode_value(r.limit_key)
            digest = limit_digest(r.activity_name, key)
            tx.conn.execute(activity_tasks.update().where(which).values(limit_digest=digest))
            continue
        tx.conn.execute(
            activity_tasks.update().where(which).values(status=TaskStatus.SCHEDULED.value, dispatched_at=now)
        )
        tx.dispatch_activity(
            execution_id,
            r.activity_id,
            r.activity_name,
            r.queue,
            r.attempt,
            r.adopted,
            r.start_to_close,
            priority=r.priority,
            call_convention=r.call_convention,
        )


def take_eagerly(tx: Tx, taking: EagerTake, started_seq: int | None = None) -> None:
    """Claim a row this settle just released (its slot, and its token, taken in this write) for
    the deciding thread: ``running`` under its lease, its ``ActivityStarted`` appended at the
    run's next seq (the run row is this transaction's own, locked first), as the claim
    statement would, so ActivityStarted still commits before the body. Its message is not sent:
    the thread runs it (``Runtime.send`` holds the claimed dispatch)."""
    seq = started_seq
    if seq is None:  # not taken by the settle's own statement (a rate's steps, SQLite)
        seq = tx.dialect.one_statement(_take_in_one, _take_stepwise)(tx, taking)
    claim = replace(taking.claim, started_seq=seq)
    tx.dispatches.append(replace(taking.dispatch, claimed=claim))


def _taken(tx: Tx, taking: EagerTake) -> tuple[Any, Any, dict[str, Any]]:
    c = taking.claim
    task = (
        activity_tasks.update()
        .where(
            (activity_tasks.c.execution_id == c.execution_id)
            & (activity_tasks.c.activity_id == c.activity_id)
            & (activity_tasks.c.status == TaskStatus.SCHEDULED.value)
        )
        .values(
            status=TaskStatus.RUNNING.value,
            worker_id=c.worker_id,
            started_at=c.started_at,
            lease_expires_at=taking.lease_expires_at,
        )
    )
    bump = executions.update().values(next_seq=executions.c.next_seq + 1)
    started = ev.ActivityStarted(c.activity_id, c.attempt, c.worker_id).to_data()
    event = {
        "execution_id": c.execution_id,
        "type": started["type"],
        "data": started,
        "recorded_at": c.started_at,
    }
    return task, bump, event


def _take_in_one(tx: Tx, taking: EagerTake) -> int:
    """Postgres: the claim, the seq and the event in one statement (the task row is locked by
    this transaction's release, the run row by its own lock)."""
    task, bump, event = _taken(tx, taking)
    took = task.returning(activity_tasks.c.execution_id).cte("took")
    seq = (
        bump.where(executions.c.id == took.c.execution_id)
        .returning((executions.c.next_seq - 1).label("seq"))
        .cte("seq")
    )
    row = sa.select(
        sa.literal(event["execution_id"], events.c.execution_id.type),
        seq.c.seq,
        sa.literal(event["type"], events.c.type.type),
        sa.literal(event["data"], events.c.data.type),
        sa.literal(event["recorded_at"], events.c.recorded_at.type),
    )
    insert = events.insert().from_select(["execution_id", "seq", "type", "data", "recorded_at"], row)
    return int(tx.conn.execute(insert.returning(events.c.seq).add_cte(took, seq)).scalar_one())


def _take_stepwise(tx: Tx, taking: EagerTake) -> int:
    task, bump, event = _taken(tx, taking)
    assert tx.conn.execute(task).rowcount == 1
    run = taking.claim.execution_id
    seq = int(
        tx.conn.execute(
            bump.where(executions.c.id == run).returning((executions.c.next_seq - 1).label("seq"))
        ).scalar_one()
    )
    tx.conn.execute(events.insert().values(seq=seq, **event))
    return seq


# the wait order: compensations first, then priority descending, then arrival (FIFO)
WAIT_ORDER = (
    activity_tasks.c.compensation.desc(),
    activity_tasks.c.priority.desc(),
    activity_tasks.c.wait_seq,
)


def _release(tx: Tx, name: str, digest: str, free: int | None) -> list[sa.Row[Any]]:
    q = (
        sa.select(activity_tasks)
        .where(_of(name, digest) & (activity_tasks.c.status == TaskStatus.WAITING.value))
        .order_by(*WAIT_ORDER)
    )
    if free is not None:
        q = q.limit(free)
    return list(tx.conn.execute(tx.dialect.lock(q, skip_locked=True)).all())


def waiting_limits(tx: Tx, limit: int = 100) -> list[tuple[str, str]]:
    """Every limit some row waits under (the sweeper's backstop settles each), the longest
    waiting first, so a pass capped at ``limit`` never starves a limit. A reset's *held* row
    (WAITING under no limit until its run is admitted, ``release_held``) is under none."""
    t = activity_tasks.c
    rows = tx.conn.execute(
        sa.select(t.activity_name, t.limit_digest)
        .where((t.status == TaskStatus.WAITING.value) & t.limit_digest.is_not(None))
        .group_by(t.activity_name, t.limit_digest)
        .order_by(sa.func.min(t.wait_seq))
        .limit(limit)
    ).all()
    return [(r.activity_name, r.limit_digest) for r in rows]


def next_wait_seq(tx: Tx) -> int:
    return tx.dialect.next_wait_seq(tx.conn)


def wait_in_line(tx: Tx, name: str, spec: Limits) -> int:
    """A new limited row's wait order, its name's row declared first (``declare``): on
    Postgres one statement (the insert a data-modifying CTE of the ``nextval``)."""
    return tx.dialect.one_statement(_numbered_in_one, _numbered_stepwise)(tx, name, spec)


def _numbered_in_one(tx: Tx, name: str, spec: Limits) -> int:
    # only when the snapshot has no such row: ON CONFLICT on an existing one would wait for the
    # transaction holding its lock (an unkeyed limit's row is its name's own)
    values = {"name": name, "key_digest": NAME_ROW, "in_use": 0, **_declared(spec)}
    new = sa.select(*(sa.literal(v, limits.c[k].type).label(k) for k, v in values.items())).where(
        ~sa.exists().where((limits.c.name == name) & (limits.c.key_digest == NAME_ROW))
    )
    declared = tx.dialect.insert_ignore(limits).from_select(list(values), new).cte("declared")
    return int(tx.conn.execute(sa.select(WAIT_SEQ.next_value()).add_cte(declared)).scalar_one())


def _numbered_stepwise(tx: Tx, name: str, spec: Limits) -> int:
    declare(tx, name, spec)
    return next_wait_seq(tx)


def _declared(spec: Limits) -> dict[str, Any]:
    return {
        "declared_concurrency": spec.concurrency,
        "declared_rate_limit": spec.rate_limit.text if spec.rate_limit is not None else None,
    }


def declare(tx: Tx, name: str, spec: Limits) -> None:
    """The name's own row exists, with the declared values if it is new (a first dispatch)."""
    tx.conn.execute(
        tx.dialect.insert_ignore(limits).values(name=name, key_digest=NAME_ROW, in_use=0, **_declared(spec))
    )


def sync_declared(tx: Tx, registry: Registry, now: datetime) -> None:
    """Write the decorators' values into each limited name's own row (worker start); an
    override is never touched by it."""
    for name, definition in sorted(registry.activities.items()):
        if not definition.limits.limited:
            continue
        declare(tx, name, definition.limits)
        before = in_force(tx, name)[1]
        tx.conn.execute(
            limits.update()
            .where((limits.c.name == name) & (limits.c.key_digest == NAME_ROW))
            .values(updated_at=now, **_declared(definition.limits))
        )
        _rate_changed(tx, name, before, in_force(tx, name)[1])


# ── run-time overrides (``harvest.set_limit``, ``harvest limits``) ───────────────────────────
def known(tx: Tx, name: str) -> bool:
    """The name has a limit row (a worker declared it, or it was dispatched)."""
    found = tx.conn.execute(
        sa.select(limits.c.name).where((limits.c.name == name) & (limits.c.key_digest == NAME_ROW))
    ).first()
    return found is not None


def set_override(
    tx: Tx, name: str, now: datetime, *, concurrency: int | None, rate_limit: str | None, clear: bool
) -> None:
    """Write the name's override (each value given replaces its own; ``clear`` drops both),
    then its keys are settled by the caller: a raised limit releases what now fits; a lowered
    one stops no running body, only new slots and tokens."""
    where = (limits.c.name == name) & (limits.c.key_digest == NAME_ROW)
    tx.conn.execute(tx.dialect.lock(sa.select(limits.c.name).where(where))).first()
    before = in_force(tx, name)[1]
    values: dict[str, Any] = {"updated_at": now}
    if clear:
        values.update(override_concurrency=None, override_rate_limit=None, override_set_at=None)
    else:
        values["override_set_at"] = now
        if concurrency is not None:
            values["override_concurrency"] = concurrency
        if rate_limit is not None:
            values["override_rate_limit"] = rate_limit
    tx.conn.execute(limits.update().where(where).values(**values))
    _rate_changed(tx, name, before, in_force(tx, name)[1])


def _rate_changed(tx: Tx, name: str, before: RateLimit | None, after: RateLimit | None) -> None:
    """A changed rate re-spaces each key's next token from its last start (``tat`` minus the
    old interval): a raised rate does not wait out the old spacing, a lowered one follows the
    new spacing from the last start on. A rate gone leaves no waiting row a due time."""
    if before is not None and after is None:
        rates.clear_due(tx, name)
    if before is None or after is None or before.interval == after.interval:
        return
    shift = timedelta(seconds=after.interval - before.interval)
    rows = tx.conn.execute(
        tx.dialect.lock(
            sa.select(limits.c.key_digest, limits.c.tat)
            .where((limits.c.name == name) & limits.c.tat.is_not(None))
            .order_by(limits.c.key_digest)
        )
    ).all()
    for row in rows:
        tx.conn.execute(
            limits.update()
            .where((limits.c.name == name) & (limits.c.key_digest == row.key_digest))
            .values(tat=row.tat + shift)
        )


def keys_of(tx: Tx, name: str) -> list[str]:
    """Every key digest a name's limit has a row for (its own row included)."""
    rows = tx.conn.execute(sa.select(limits.c.key_digest).where(limits.c.name == name)).all()
    return [r.key_digest for r in rows]


_OWN_COLUMNS = (
    "declared_concurrency",
    "override_concurrency",
    "declared_rate_limit",
    "override_rate_limit",
    "override_set_at",
)


def usage(tx: Tx) -> list[dict[str, Any]]:
    """One entry per limited name: declared and override values (concurrency, rate), when the
    override was set, slots in use and rows waiting, summed over its keys (no key is named: a
    key is payload)."""
    rows = tx.conn.execute(sa.select(limits).order_by(limits.c.name, limits.c.key_digest)).all()
    waiting: dict[str, int] = {
        name: int(n)
        for name, n in tx.conn.execute(
            sa.select(activity_tasks.c.activity_name, sa.func.count())
            .where(activity_tasks.c.status == TaskStatus.WAITING.value)
            .group_by(activity_tasks.c.activity_name)
        ).all()
    }
    found: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = found.setdefault(r.name, {"name": r.name, "in_use": 0, "keys": 0})
        if r.key_digest == NAME_ROW:
            entry.update(
                declared_concurrency=r.declared_concurrency,
                override_concurrency=r.override_concurrency,
                declared_rate_limit=r.declared_rate_limit,
                override_rate_limit=r.override_rate_limit,
                override_set_at=r.override_set_at,
            )
        else:
            entry["keys"] += 1
        entry["in_use"] += int(r.in_use)
    for entry in found.values():
        entry["waiting"] = int(waiting.get(entry["name"], 0))
        for column in _OWN_COLUMNS:
            entry.setdefault(column, None)
    return list(found.values())
