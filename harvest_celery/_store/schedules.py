"""Schedules in Postgres: create, edit, pause, resume, delete, trigger, and the firing pass.

The firing pass takes due rows with ``SELECT … FOR UPDATE SKIP LOCKED``, due by the database's
own clock (``Dialect.clock``: ``clock_timestamp()``), so any number of schedulers may run and
host clock skew does not matter. Only the lock holder judges overlap, ``max_runs`` and
``end_at`` (``_core.schedule.plan``), starts the runs (``id_reuse="use_existing"``), advances
``last_tick`` and ``next_fire_at`` and bumps the counters, all in the one transaction; its
decision messages go after commit (``Tx.dispatches``). Edits, pause, resume and delete lock the
row with plain ``FOR UPDATE``, so they wait for a firing in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from harvest_celery._core.invocation import START_TASK, CallOptions, start_task_input
from harvest_celery._core.lifecycle import TERMINAL_STATUSES
from harvest_celery._core.schedule import Spec, fire_at, plan, tick_id
from harvest_celery._errors import ScheduleAlreadyExists, ScheduleNotFound
from harvest_celery._payloads.stores import is_reference
from harvest_celery._store import admission, links, starts
from harvest_celery._store.schema import executions, schedules
from harvest_celery._store.tx import Tx

UTC = timezone.utc
t = schedules.c


def input_key(name: str) -> str:
    """The blob key of a schedule's offloaded input: a ``:`` no run id may hold."""
    return f"schedules:{name}/input"


def spec_of(row: Any) -> Spec:
    return Spec(cron=row.cron, every=row.every_seconds, timezone=row.timezone, jitter=row.jitter_seconds)


TASK = "task"  # a schedule whose target is an adopted Celery task (import-beat)


def run_of(row: Any, data: Any) -> tuple[str, Any]:
    """The workflow a tick starts and its input: the schedule's workflow with its input, or for
    a task schedule the built-in ``harvest.start_task`` run calling the task with the stored
    call on its queue (as ``Harvest.start_task`` would)."""
    if row.target == TASK:
        return START_TASK, start_task_input(row.workflow, data, row.queue, CallOptions())
    return row.workflow, data


def targets(kinds: Sequence[str] | None, tasks: Sequence[str]) -> Any:
    """Rows this process may fire: workflow schedules of its ``kinds``, task schedules of its
    adopted ``tasks`` (None: every row)."""
    if kinds is None:
        return sa.true()
    return ((t.target != TASK) & t.workflow.in_(list(kinds))) | (
        (t.target == TASK) & t.workflow.in_(list(tasks))
    )


def db_now(tx: Tx) -> datetime:
    now = tx.conn.execute(sa.select(tx.dialect.clock())).scalar_one()
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


def aware(value: Any) -> Any:
    return value if value is None or value.tzinfo is not None else value.replace(tzinfo=UTC)


def next_fire(name: str, spec: Spec, tick: datetime | None) -> datetime | None:
    return fire_at(name, tick, spec.jitter) if tick is not None else None


def create(tx: Tx, values: dict[str, Any], input: Any, digest: str) -> None:
    """Insert a schedule; ``ScheduleAlreadyExists`` if the name is taken (nothing written)."""
    now = db_now(tx)
    name = values["name"]
    spec = Spec(values["cron"], values["every_seconds"], values["timezone"], values["jitter_seconds"])
    first = spec.after(now)
    end_at = values.get("end_at")
    ended = (end_at is not None and first > end_at) or False
    row = {
        **values,
        "input": None,
        "input_digest": digest,
        "spec_version": 1,
        "paused": False,
        "pause_note": None,
        "last_tick": now,
        "next_fire_at": None if ended else next_fire(name, spec, first),
        "buffered_tick": None,
        "last_run_id": None,
        "runs": 0,
        "fired": 0,
        "skipped": 0,
        "missed": 0,
        "created_at": now,
        "updated_at": now,
    }
    inserted = tx.conn.execute(tx.dialect.insert_ignore(schedules).values(**row).returning(t.name)).first()
    if inserted is None:
        raise ScheduleAlreadyExists(name)
    encoded = tx.payloads.encode_value(input, input_key(name))
    tx.conn.execute(schedules.update().where(t.name == name).values(input=encoded))


def lock(tx: Tx, name: str) -> Any:
    row = tx.conn.execute(tx.dialect.lock(sa.select(schedules).where(t.name == name))).first()
    if row is None:
        raise ScheduleNotFound(name)
    return row


def get(tx: Tx, name: str) -> Any:
    row = tx.conn.execute(sa.select(schedules).where(t.name == name)).first()
    if row is None:
        raise ScheduleNotFound(name)
    return row


def listed(tx: Tx) -> list[Any]:
    return list(tx.conn.execute(sa.select(schedules).order_by(t.name)).all())


def run_statuses(tx: Tx, run_ids: Sequence[str]) -> dict[str, str]:
    if not run_ids:
        return {}
    rows = tx.conn.execute(
        sa.select(executions.c.id, executions.c.status).where(executions.c.id.in_(list(run_ids)))
    )
    return {r.id: r.status for r in rows}


def recent_runs(tx: Tx, name: str, limit: int) -> list[Any]:
    """The schedule's latest runs (nominal and manual ids), newest first: id and status."""
    pattern = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "@%"
    query = (
        sa.select(executions.c.id, executions.c.status)
        .where(executions.c.id.like(pattern, escape="\\"))
        .order_by(executions.c.created_at.desc())
        .limit(limit)
    )
    return list(tx.conn.execute(query).all())


def _open(tx: Tx, run_id: str | None) -> bool:
    """Is the schedule's previous run open? A continue-as-new chain is open until its last link
    closes (the overlap policies see the chain as one run); a purged run is not."""
    if run_id is None:
        return False
    status = links.last_link_status(tx, run_id)
    return status is not None and status not in TERMINAL_STATUSES


def pause(tx: Tx, name: str, note: str) -> None:
    lock(tx, name)
    tx.conn.execute(
        schedules.update().where(t.name == name).values(paused=True, pause_note=note, updated_at=db_now(tx))
    )


def resume(tx: Tx, name: str) -> int:
    """Unpause: the ticks while paused count skipped and are not caught up. Returns them."""
    row = lock(tx, name)
    if not row.paused:
        return 0
    now, spec = db_now(tx), spec_of(row)
    skipped = len(list(spec.ticks(aware(row.last_tick), now)))
    following = spec.after(now)
    ended = row.next_fire_at is None or (row.end_at is not None and following > aware(row.end_at))
    tx.conn.execute(
        schedules.update()
        .where(t.name == name)
        .values(
            paused=False,
            pause_note=None,
            last_tick=now,
            skipped=t.skipped + skipped,
            next_fire_at=None if ended else next_fire(name, spec, following),
            updated_at=now,
        )
    )
    return skipped


def edit(tx: Tx, name: str, values: dict[str, Any]) -> int:
    """Change the spec: bump ``spec_version`` and recompute ``next_fire_at`` from the later of
    ``last_tick`` and now, under the row lock, so no tick of the old spec fires after this
    commits and none fires twice. Returns the new version."""
    row = lock(tx, name)
    now = db_now(tx)
    merged = {**row._mapping, **values}
    spec = Spec(merged["cron"], merged["every_seconds"], merged["timezone"], merged["jitter_seconds"])
    cursor = max(aware(row.last_tick), now)
    following = spec.after(cursor)
    end_at = aware(merged["end_at"])
    done = (end_at is not None and following > end_at) or (
        merged["max_runs"] is not None and row.runs >= merged["max_runs"]
    )
    tx.conn.execute(
        schedules.update()
        .where(t.name == name)
        .values(
            **values,
            spec_version=row.spec_version + 1,
            last_tick=cursor,
            buffered_tick=None,
            next_fire_at=None if done else next_fire(name, spec, following),
            updated_at=now,
        )
    )
    return int(row.spec_version) + 1


def set_input(tx: Tx, name: str, input: Any, digest: str) -> list[tuple[str, str]]:
    """Replace the input (locked). Returns the old input's blob, to delete after commit."""
    row = lock(tx, name)
    old = blob_refs(row.input)
    encoded = tx.payloads.encode_value(input, input_key(name))
    tx.conn.execute(schedules.update().where(t.name == name).values(input=encoded, input_digest=digest))
    return [] if is_reference(encoded) else old  # a new blob under the same key replaced it


def blob_refs(stored: Any) -> list[tuple[str, str]]:
    if is_reference(stored):
        return [(str(stored.get("store_id")), str(stored.get("key")))]
    return []


def delete(tx: Tx, name: str) -> list[tuple[str, str]]:
    """Delete a schedule and its input (locked). Returns its blob, deleted after commit; runs
    already started keep their own copies."""
    row = lock(tx, name)
    tx.conn.execute(schedules.delete().where(t.name == name))
    return blob_refs(row.input)


@dataclass
class Fired:
    """What one pass did, for the metrics counted after commit."""

    workflow: str
    name: str
    fired: list[str] = field(default_factory=list)
    skipped: int = 0
    missed: int = 0
    lateness: list[float] = field(default_factory=list)


def due(
    tx: Tx,
    decision_queue: str,
    kinds: Sequence[str] | None,
    limit: int,
    exclude: Sequence[str] = (),
    tasks: Sequence[str] = (),
) -> list[Any]:
    """Lock the due rows of this decision queue (and of these workflows, or adopted tasks) that
    no other scheduler holds: ``FOR UPDATE SKIP LOCKED``, due by the database clock."""
    query = (
        sa.select(schedules)
        .where(
            (t.decision_queue == decision_queue)
            & ~t.paused
            & (
                ((t.next_fire_at.is_not(None)) & (t.next_fire_at <= tx.dialect.clock()))
                | t.buffered_tick.is_not(None)
            )
        )
        .where(targets(kinds, tasks))
        .order_by(t.next_fire_at)
        .limit(limit)
    )
    if exclude:
        query = query.where(t.name.not_in(list(exclude)))
    return list(tx.conn.execute(tx.dialect.lock(query, skip_locked=True)).all())


def fire_due(
    tx: Tx,
    decision_queue: str,
    kinds: Sequence[str] | None,
    limit: int = 1,
    exclude: Sequence[str] = (),
    tasks: Sequence[str] = (),
    seen: datetime | None = None,
    admit: Admit | None = None,
) -> list[Fired]:
    """Fire up to ``limit`` due rows (not in ``exclude``), in this one transaction. A row that
    fails raises ``FiringFailed`` naming it (the transaction is then rolled back). ``seen``:
    when the firing pass began (``plan``: lateness is judged from it)."""
    out = []
    for row in due(tx, decision_queue, kinds, limit, exclude, tasks):
        try:
            out.append(_fire_row(tx, row, decision_queue, seen, admit))
        except Exception as exc:  # noqa: BLE001 - named, so the pass can go on without it
            raise FiringFailed(row.name) from exc
    return out


class FiringFailed(Exception):
    """Firing one schedule failed (the cause is chained)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"firing schedule {name!r} failed")
        self.name = name


# a tick's admission (``_store.admission.prepare`` over the firing process's registry): its
# workflow and input → ``Prepared``; a limited workflow's tick is written waiting
Admit = Callable[[str, Any], admission.Prepared]


def _start_tick(
    tx: Tx,
    run_id: str,
    kind: str,
    data: Any,
    now: datetime,
    decision_queue: str,
    tick: datetime,
    admit: Admit | None,
) -> bool:
    """Start a tick's run as ``start_workflow`` would: through admission (a limited workflow's
    run waits for a slot, and the overlap policies count it open while it waits)."""
    admitting = admit(kind, data) if admit is not None else None  # InvalidLimitKey: nothing written
    if admitting is not None:
        admitting.declare(tx, kind)
    return starts.start(
        tx,
        run_id,
        kind,
        data,
        now,
        decision_queue,
        id_reuse="use_existing",
        scheduled_for=tick,
        admission=admitting.columns(tx.dialect, tx.payloads, run_id) if admitting is not None else None,
    )


def _fire_row(
    tx: Tx, row: Any, decision_queue: str, seen: datetime | None = None, admit: Admit | None = None
) -> Fired:
    now = db_now(tx)
    spec = spec_of(row)
    p = plan(
        spec,
        row.name,
        last_tick=aware(row.last_tick),
        now=now,
        open_run=_open(tx, row.last_run_id),
        buffered=aware(row.buffered_tick),
        overlap=row.overlap,
        catchup_window=row.catchup_seconds,
        runs=row.runs,
        max_runs=row.max_runs,
        end_at=aware(row.end_at),
        seen=seen,
    )
    done = Fired(row.workflow, row.name, skipped=p.skipped, missed=p.missed, lateness=p.lateness)
    if p.fire:
        kind, data = run_of(row, tx.payloads.decode_value(row.input))
        for tick in p.fire:
            run_id = tick_id(row.name, tick)
            _start_tick(tx, run_id, kind, data, now, decision_queue, tick, admit)
            done.fired.append(run_id)
    tx.conn.execute(
        schedules.update()
        .where(t.name == row.name)
        .values(
            last_tick=p.last_tick,
            buffered_tick=p.buffered,
            next_fire_at=next_fire(row.name, spec, p.next_tick),
            last_run_id=done.fired[-1] if done.fired else row.last_run_id,
            runs=t.runs + len(p.fire),
            fired=t.fired + len(p.fire),
            skipped=t.skipped + p.skipped,
            missed=t.missed + p.missed,
            updated_at=now,
        )
    )
    return done


def trigger(
    tx: Tx, name: str, run_id: str, decision_queue: str, overlap: str | None, admit: Admit | None = None
) -> str | None:
    """Trigger-now: the schedule's overlap policy (or ``overlap``) judges; the run counts toward
    neither ``max_runs`` nor the catch-up window. Returns the run id, or None if skipped."""
    row = lock(tx, name)
    policy = overlap or row.overlap
    now = db_now(tx)
    if policy != "allow_all" and _open(tx, row.last_run_id):
        tx.conn.execute(schedules.update().where(t.name == name).values(skipped=t.skipped + 1))
        return None
    kind, data = run_of(row, tx.payloads.decode_value(row.input))
    _start_tick(tx, run_id, kind, data, now, decision_queue, now, admit)
    tx.conn.execute(
        schedules.update().where(t.name == name).values(last_run_id=run_id, fired=t.fired + 1, updated_at=now)
    )
    return run_id


def backfill_begin(tx: Tx, name: str, start: datetime, end: datetime) -> datetime:
    """Record a backfill's range; returns where it starts: its cursor, when the same range was
    begun before and killed mid-way (``backfill_tick`` moves the cursor past each tick)."""
    row = lock(tx, name)
    if (aware(row.backfill_from), aware(row.backfill_to)) == (start, end) and row.backfill_cursor is not None:
        return aware(row.backfill_cursor)  # type: ignore[no-any-return]
    cursor = start - timedelta(microseconds=1)
    tx.conn.execute(
        schedules.update()
        .where(t.name == name)
        .values(backfill_from=start, backfill_to=end, backfill_cursor=cursor)
    )
    return cursor


def backfill_end(tx: Tx, name: str) -> None:
    lock(tx, name)
    tx.conn.execute(
        schedules.update()
        .where(t.name == name)
        .values(backfill_from=None, backfill_to=None, backfill_cursor=None)
    )


def backfill_tick(tx: Tx, name: str, tick: datetime, decision_queue: str, admit: Admit | None = None) -> bool:
    """Start one nominal tick of a backfill and move its cursor past it, in one transaction;
    False if its run still exists ("already ran")."""
    row = lock(tx, name)
    tx.conn.execute(schedules.update().where(t.name == name).values(backfill_cursor=tick))
    kind, data = run_of(row, tx.payloads.decode_value(row.input))
    return _start_tick(tx, tick_id(name, tick), kind, data, db_now(tx), decision_queue, tick, admit)


def seconds_to_next(
    tx: Tx, decision_queue: str, kinds: Sequence[str] | None, tasks: Sequence[str] = ()
) -> float | None:
    """Seconds until the earliest ``next_fire_at`` of this queue's schedules, by the database
    clock; None if there is none."""
    query = sa.select(sa.func.min(t.next_fire_at)).where(
        (t.decision_queue == decision_queue) & ~t.paused & t.next_fire_at.is_not(None) & targets(kinds, tasks)
    )
    earliest = aware(tx.conn.execute(query).scalar())
    if earliest is None:
        return None
    return max(0.0, (earliest - db_now(tx)).total_seconds())
