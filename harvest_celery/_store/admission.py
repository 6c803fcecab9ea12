"""Workflow admission in Postgres: at most N admitted runs per (workflow, key), the others
waiting in start order (docs/flow-control.md, "Workflow admission").

A run of a limited workflow is inserted *waiting*: ``admitted_at`` NULL, ``admission_seq`` from
the ``harvest_admission_seq`` sequence (never ``created_at``, which differs across app
servers), its start ``priority``, its key through the codec (a payload, tombstoned by erasure)
and the key's digest salted with the workflow name (``_payloads.digest.limit_digest``). Every
decision path refuses a waiting run (``predicates.decidable``/``fast_path``, ``Tx.append``,
``Tx.request_decision``, ``starts.take_started``), so a signal to it is appended and decides
nothing until it is admitted.

The transaction that wrote a waiting run, and every transaction that closes an admitted one,
*touches* the admission (``Tx.touch_admission``); just before commit ``settle`` runs, in the
activity limits' one lock order (own run row, then the limit row, then waiting runs' rows
``FOR UPDATE SKIP LOCKED``; ``Tx.settle_limits``):

1. lock the limit row (the workflow name's ``harvest_limits`` row for a global limit, the key
   digest's row for a keyed one);
2. count the admitted runs still RUNNING: that is ``in_use``, stored back (a slot belongs to a
   run, not to a worker: an nd-blocked or paused run keeps it; a close frees it);
3. admit the next waiting runs that fit, highest priority first, then lowest ``admission_seq``
   among the committed rows (a transactional start that commits late is admitted after an
   earlier-committed start with a higher number), passing over paused ones: each gets
   ``admitted_at`` and a decision request, whose message is sent after commit. Nothing is
   written into their histories.

A warm close in one guarded statement (psycopg2) sends the settle's steps after its write in
the same trip, one implicit transaction in the same lock order (``close_in_one_trip``).

A start made in an application's transaction never settles there (it would hold a shared row
for the length of someone else's transaction): it is admitted by the claimant of its
announcement (``admit_started``) or by the sweeper, which settles every key with waiting runs
each pass (``waiting_keys``): the backstop, with a bound of one ``sweep_interval``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from harvest_celery._core.admission import Admission, key_of, start_priority
from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._core.limits import Limits
from harvest_celery._core.registry import Registry
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._store import limits, sql
from harvest_celery._store.dialect import Dialect
from harvest_celery._store.schema import ADMISSION_SEQ, executions

__all__ = [
    "admit_started",
    "declare",
    "holders",
    "Prepared",
    "prepare",
    "settle",
    "sync_declared",
    "waiting_keys",
    "waiting_position",
]


class Tx(Protocol):
    """What admission needs of its transaction (``_store.tx.Tx``)."""

    conn: Connection
    dialect: Dialect
    payloads: Any
    unsettled: set[tuple[str, str]]

    def touch_admission(self, name: str, digest: str | None) -> None: ...

    def decide_admitted(self, execution_id: str, queue: str, now: datetime) -> None: ...


_c = executions.c


def _of(name: str, digest: str) -> sa.ColumnElement[bool]:
    return (_c.workflow_type == name) & (_c.limit_digest == digest)


def _waiting() -> sa.ColumnElement[bool]:
    return _c.admitted_at.is_(None) & (_c.status == RUNNING)


def declare(tx: Tx, name: str, admission: Admission) -> None:
    """The workflow's own limit row exists, with its declared concurrency if it is new. Inserted
    only when the snapshot has none: ``ON CONFLICT`` on the existing row would wait for the
    commit of whichever transaction has updated it (a global limit's settle, ``set_limit``, a
    worker's ``sync_declared``), outside the row lock's own queue."""
    if not tx.dialect.row_locks:  # SQLite: one writer at a time
        limits.declare(tx, name, Limits(concurrency=admission.concurrency))  # type: ignore[arg-type]
        return
    row = limits.limits.c
    values = {"name": name, "key_digest": limits.NAME_ROW, "in_use": 0}
    values["declared_concurrency"] = admission.concurrency
    new = sa.select(*(sa.literal(v, row[k].type).label(k) for k, v in values.items())).where(
        ~sa.exists().where((row.name == name) & (row.key_digest == limits.NAME_ROW))
    )
    tx.conn.execute(tx.dialect.insert_ignore(limits.limits).from_select(list(values), new))


def sync_declared(tx: Tx, registry: Registry, now: datetime) -> None:
    """Write each limited workflow's declared concurrency into its own row (worker start); an
    override is never touched by it."""
    for name, definition in sorted(registry.workflows.items()):
        if definition.admission.limited:
            _DECLARED.add(name)
            declare(tx, name, definition.admission)
            tx.conn.execute(
                limits.limits.update()
                .where((limits.limits.c.name == name) & (limits.limits.c.key_digest == limits.NAME_ROW))
                .values(declared_concurrency=definition.admission.concurrency, updated_at=now)
            )


def _next_seq(dialect: Dialect) -> Any:
    """The start order, taken by the insert itself: the sequence on Postgres; SQLite has one
    writer at a time, so the highest so far plus one."""
    if dialect.row_locks:
        return ADMISSION_SEQ.next_value()
    top = sa.select(sa.func.coalesce(sa.func.max(_c.admission_seq), 0) + 1).scalar_subquery()
    return top


@dataclass(frozen=True)
class Prepared:
    """A start's admission, decided before any write: its priority, and for a limited
    workflow its key (None: one global limit) and the key's salted digest."""

    priority: int
    limited: bool = False
    key: str | None = None
    digest: str | None = None
    concurrency: int | None = None  # declared: the limit row is made with it on first use

    def declare(self, tx: Tx, name: str) -> None:
        """The workflow's limit row exists (a start in a transaction of harvest's own)."""
        if self.limited:
            declare(tx, name, Admission(self.concurrency))

    def columns(self, dialect: Dialect, payloads: Any, execution_id: str) -> dict[str, Any]:
        """Its run-row columns: for an unlimited workflow only a priority other than 0, so its
        start is today's insert (admitted by the column's default)."""
        if not self.limited:
            return {"priority": self.priority} if self.priority else {}
        return {
            "priority": self.priority,
            "admitted_at": None,
            "admission_seq": _next_seq(dialect),
            "limit_key": self.encoded_key(payloads, execution_id),
            "limit_digest": self.digest,
        }

    def encoded_key(self, payloads: Any, execution_id: str) -> Any:
        return None if self.key is None else payloads.encode_value(self.key, f"{execution_id}/limit_key")


def prepare(registry: Registry, name: str, input: Any, priority: object) -> Prepared:
    """Check a start's priority and compute its key (``ValueError``, ``InvalidLimitKey``): run
    before anything is written, so a refused start leaves no row and no event."""
    level = start_priority(priority)
    definition = registry.workflows.get(name)
    if definition is None or not definition.admission.limited:
        return Prepared(level)
    key = key_of(name, definition.admission, input)
    return Prepared(level, True, key, limit_digest(name, key), definition.admission.concurrency)


def copied_values(tx: Tx, source_id: str, new_id: str) -> dict[str, Any]:
    """A run made from a source (reset, fork, DAG retry): the source's priority and key, copied
    and never recomputed; a limited one waits in line again, with a new number."""
    found = tx.conn.execute(
        sa.select(_c.workflow_type, _c.priority, _c.limit_key, _c.limit_digest).where(_c.id == source_id)
    ).first()
    if found is None or found.limit_digest is None:
        return {"priority": int(found.priority or 0)} if found is not None else {}
    key = None if found.limit_key is None else tx.payloads.decode_value(found.limit_key)
    tx.touch_admission(found.workflow_type, found.limit_digest)
    return {
        "priority": int(found.priority or 0),
        "admitted_at": None,
        "admission_seq": _next_seq(tx.dialect),
        "limit_key": None if key is None else tx.payloads.encode_value(key, f"{new_id}/limit_key"),
        "limit_digest": found.limit_digest,
    }


def inherited_values(tx: Tx, predecessor_id: str, next_id: str) -> dict[str, Any]:
    """A continue-as-new link's admission: it inherits its predecessor's slot (admitted as it
    was, the same key, number and priority), so the chain never waits in line again and the
    predecessor's close frees nothing (the settle's recount finds the link holding the slot)."""
    found = tx.conn.execute(
        sa.select(_c.priority, _c.limit_key, _c.limit_digest, _c.admitted_at, _c.admission_seq).where(
            _c.id == predecessor_id
        )
    ).first()
    if found is None:
        return {}
    if found.limit_digest is None:
        return {"priority": int(found.priority or 0)} if found.priority else {}
    key = None if found.limit_key is None else tx.payloads.decode_value(found.limit_key)
    return {
        "priority": int(found.priority or 0),
        "admitted_at": found.admitted_at,
        "admission_seq": found.admission_seq,
        "limit_key": None if key is None else tx.payloads.encode_value(key, f"{next_id}/limit_key"),
        "limit_digest": found.limit_digest,
    }


def in_force(tx: Tx, name: str) -> int | None:
    return limits.in_force(tx, name)[0]  # type: ignore[arg-type]


def settle(tx: Tx, name: str, digest: str, now: datetime) -> int:
    """Recount the key's admitted runs and admit what fits (see the module); the runs admitted.
    Postgres: the row, its lock and the settle in one round trip (``sql.ADMISSION_STEPS``)."""
    return tx.dialect.one_statement(_settle_in_one, _settle_stepwise)(tx, name, digest, now)


def _settle_in_one(tx: Tx, name: str, digest: str, now: datetime) -> int:
    params = {"name": name, "digest": digest, "now": now}
    admitted = tx.dialect.in_one_trip(tx.conn, sql.ADMISSION_STEPS, params).all()
    for r in admitted:
        tx.decide_admitted(r.id, r.decision_queue or "harvest", now)
        if r.has_held:  # a reset's held rows (``_admit``'s ``release_held``)
            limits.release_held(tx, r.id, now)  # type: ignore[arg-type]
    return len(admitted)


def close_in_one_trip(tx: Tx, statement: tuple[str, dict[str, Any]], now: datetime) -> bool:
    """A guarded write that closes a limited workflow's run (``pgwrite.guarded``), its key's
    settle after it in the same trip: one implicit transaction in autocommit, the one lock order
    (``sql.ADMISSION_CLOSE_STEPS``). Was it written? The admitted runs' decision requests are
    staged; a settle deferred (a run it would admit has held rows, which ``limits.release_held``
    releases in Python) is left in ``tx.unsettled`` for a transaction of its own (the
    sweeper's backstop if that never happens)."""
    text, params = statement
    texts = (text, *sql.ADMISSION_CLOSE_STEPS)
    rows = tx.dialect.in_one_trip(tx.conn, texts, {**params, "now": now}).all()
    for r in rows:
        if r.id is not None:
            tx.decide_admitted(r.id, r.decision_queue or "harvest", now)
    if rows and rows[0].deferred:
        tx.unsettled.add((rows[0].name, rows[0].digest))
    return bool(rows)


def _settle_stepwise(tx: Tx, name: str, digest: str, now: datetime) -> int:
    limits.ensure(tx, name, digest)  # type: ignore[arg-type]
    row = limits.limits.c
    tx.conn.execute(
        tx.dialect.lock(sa.select(row.in_use).where((row.name == name) & (row.key_digest == digest)))
    ).first()
    in_use = tx.conn.execute(
        sa.select(sa.func.count())
        .select_from(executions)
        .where(_of(name, digest) & _c.admitted_at.is_not(None) & (_c.status == RUNNING))
    ).scalar_one()
    limit = in_force(tx, name)
    free = 0 if limit is None else max(0, limit - in_use)
    admitted = _admit(tx, name, digest, free, now) if free else []
    tx.conn.execute(
        limits.limits.update()
        .where((row.name == name) & (row.key_digest == digest))
        .values(in_use=in_use + len(admitted), updated_at=now)
    )
    return len(admitted)


def _admit(tx: Tx, name: str, digest: str, free: int, now: datetime) -> list[str]:
    q = (
        sa.select(_c.id, _c.decision_queue)
        .where(_of(name, digest) & _waiting() & _c.paused_at.is_(None))
        .order_by(_c.priority.desc(), _c.admission_seq)
        .limit(free)
    )
    rows = tx.conn.execute(tx.dialect.lock(q, skip_locked=True)).all()
    for r in rows:
        tx.conn.execute(
            executions.update()
            .where(_c.id == r.id)
            .values(admitted_at=now, decision_requested_at=now, updated_at=now)
        )
        tx.decide_admitted(r.id, r.decision_queue or "harvest", now)
        limits.release_held(tx, r.id, now)  # type: ignore[arg-type]  # a reset's held rows
    return [r.id for r in rows]


def admit_started(tx: Tx, ids: Sequence[str]) -> int:
    """Announced starts that are waiting: touch their keys, so this transaction's settle admits
    what fits (``take_started``'s claimant, in a transaction of its own). How many wait."""
    rows = tx.conn.execute(
        sa.select(_c.workflow_type, _c.limit_digest).where(
            _c.id.in_(list(ids)) & _waiting() & _c.limit_digest.is_not(None)
        )
    ).all()
    for r in rows:
        tx.touch_admission(r.workflow_type, r.limit_digest)
    return len(rows)


def limits_runs(tx: Tx, name: str) -> bool:
    """Is ``name``'s limit row a workflow's admission limit (a declared limited workflow, or
    one with runs under a limit)? ``set_limit`` settles admissions then, not activity slots."""
    found = tx.conn.execute(
        sa.select(_c.id).where((_c.workflow_type == name) & _c.limit_digest.is_not(None)).limit(1)
    ).first()
    return found is not None or name in _DECLARED


# workflow names whose admission limit this process declared (``sync_declared``)
_DECLARED: set[str] = set()


def waiting_keys(tx: Tx, limit: int = 100) -> list[tuple[str, str]]:
    """Every (workflow, key digest) some run waits under: the sweeper's backstop settles each."""
    rows = tx.conn.execute(
        sa.select(_c.workflow_type, _c.limit_digest)
        .where(_waiting() & _c.limit_digest.is_not(None))
        .distinct()
        .limit(limit)
    ).all()
    return [(r.workflow_type, r.limit_digest) for r in rows]


def settle_waiting(tx: Tx, now: datetime) -> None:
    """The sweeper's backstop: settle every key some run waits under, before this transaction
    commits (a close whose process died before its settle, a transactional start nobody
    claimed, a paused waiting run resumed)."""
    for name, digest in waiting_keys(tx):
        tx.touch_admission(name, digest)


# ── visibility: position, holders (``describe``, ``stuck``), the gauges ──────────────────────
def waiting_position(conn: Connection, execution_id: str) -> dict[str, Any] | None:
    """A waiting run's place: ``{"workflow", "position", "waiting", "in_use", "concurrency"}``
    (position 1 is admitted next), or None when the run is not waiting."""
    me = conn.execute(
        sa.select(_c.workflow_type, _c.limit_digest, _c.priority, _c.admission_seq).where(
            (_c.id == execution_id) & _waiting()
        )
    ).first()
    if me is None or me.limit_digest is None:
        return None
    same = _of(me.workflow_type, me.limit_digest)
    ahead = (_c.priority > me.priority) | (
        (_c.priority == me.priority) & (_c.admission_seq < me.admission_seq)
    )
    count = sa.func.count()
    waiting = conn.execute(sa.select(count).where(same & _waiting())).scalar_one()
    before = conn.execute(sa.select(count).where(same & _waiting() & ahead)).scalar_one()
    in_use = conn.execute(
        sa.select(count).where(same & _c.admitted_at.is_not(None) & (_c.status == RUNNING))
    ).scalar_one()
    row = limits.limits.c
    found = conn.execute(
        sa.select(row.declared_concurrency, row.override_concurrency).where(
            (row.name == me.workflow_type) & (row.key_digest == limits.NAME_ROW)
        )
    ).first()
    concurrency = None
    if found is not None:
        concurrency = (
            found.override_concurrency
            if found.override_concurrency is not None
            else found.declared_concurrency
        )
    return {
        "workflow": me.workflow_type,
        "position": int(before) + 1,
        "waiting": int(waiting),
        "in_use": int(in_use),
        "concurrency": concurrency,
        "digest": me.limit_digest,
    }


def holders(conn: Connection, name: str, digest: str) -> list[Any]:
    """The admitted runs holding the key's slots, oldest admission first (``stuck()``)."""
    return list(
        conn.execute(
            sa.select(
                _c.id,
                _c.paused_at,
                _c.nd_blocked_at,
                _c.nd_block_reason,
                _c.decision_requested_at,
                _c.cancel_requested_at,
            )
            .where(_of(name, digest) & _c.admitted_at.is_not(None) & (_c.status == RUNNING))
            .order_by(_c.admitted_at, _c.id)
        ).all()
    )


def gauges(conn: Connection) -> list[tuple[str, int, int]]:
    """Per limited workflow: (workflow, runs waiting, runs holding a slot), summed over keys."""
    rows = conn.execute(
        sa.select(
            _c.workflow_type,
            sa.func.count().filter(_c.admitted_at.is_(None)),
            sa.func.count().filter(_c.admitted_at.is_not(None)),
        )
        .where(_c.limit_digest.is_not(None) & (_c.status == RUNNING))
        .group_by(_c.workflow_type)
        .order_by(_c.workflow_type)
    ).all()
    return [(r[0], int(r[1]), int(r[2])) for r in rows]
