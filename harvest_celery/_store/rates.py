"""Rate limits, enforced in Postgres: GCRA from the database's clock (docs/flow-control.md).

A rate limit of ``count/period`` has the emission interval T = period / count and a burst of
one, as Celery's: the limit row's ``tat`` (GCRA's theoretical arrival time) is when its next
token is free. A settle (``_store.limits.settle``) that may release under a rate limit:

1. has read ``tat`` and ``clock_timestamp()`` with the limit-row lock, in one statement: the
   time is the database's, never a worker's;
2. a token is free when ``tat`` is unset or not after that clock: the head of the line is
   released and ``tat`` becomes clock + T (burst one: starts are spaced T apart at least);
3. the row whose turn has come next (the new head, when a slot is free for it), or the head
   itself when there was no token, gets ``due_at = tat``: when its token will be free. A due
   time earlier than the one the row had NOTIFYs ``harvest_limits_due`` (payload: the time), so
   every sweeper's waker (``_runtime.waker``) sleeping past it re-aims;
4. another waiting row of the limit still holding a due time (a head overtaken by a higher
   priority, a slot taken meanwhile) loses it, so no waker wakes for nothing.

At the due time a waker settles the limit (``wake``): it locks the limit row with SKIP LOCKED,
and a waker that finds it locked leaves the token to whoever holds it, so one token gives one
release. A released row that is then abandoned (its run cancelled before the claim) does not
give its token back: the limit errs toward fewer starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from harvest_celery._core.limits import RateLimit, parse_rate_limit
from harvest_celery._core.names import TaskStatus
from harvest_celery._store.records import aware
from harvest_celery._store.schema import activity_tasks

WAITING = TaskStatus.WAITING.value
_T = activity_tasks.c


def in_force(declared: str | None, override: str | None) -> RateLimit | None:
    """The override, else the declared value (both stored as Celery's text); None: no rate."""
    text = override if override is not None else declared
    return None if text is None else parse_rate_limit(text)


@dataclass
class Token:
    """What one settle did under a rate limit: the rows released (at most one), the limit
    row's new ``tat``, and the seconds the released row was held back by the rate."""

    released: list[sa.Row[Any]] = field(default_factory=list)
    tat: datetime | None = None
    throttled: float = 0.0


def _of(name: str, digest: str) -> sa.ColumnElement[bool]:
    return (_T.activity_name == name) & (_T.limit_digest == digest) & (_T.status == WAITING)


def _pk(row: Any) -> sa.ColumnElement[bool]:
    return (_T.execution_id == row.execution_id) & (_T.activity_id == row.activity_id)


def release(
    tx: Any,
    name: str,
    digest: str,
    free: int | None,
    rate: RateLimit,
    tat: datetime | None,
    clock: datetime,
    order: Any,
) -> Token:
    """Steps 2 to 4 of the module, under the limit-row lock the caller holds. ``free``: slots
    free (None: no concurrency limit); ``order``: the wait order (``_store.limits``). Other
    runs' waiting rows are locked ``FOR UPDATE SKIP LOCKED``: never waited for."""
    tat, now = aware(tat), aware(clock)
    assert now is not None
    clock = now
    if free == 0:  # no row's turn has come: none waits for a token
        _due(tx, name, digest, None, None)
        return Token(tat=tat)
    token = tat is None or tat <= clock
    wanted = 2 if token and (free is None or free > 1) else 1
    heads = tx.conn.execute(
        tx.dialect.lock(
            sa.select(activity_tasks).where(_of(name, digest)).order_by(*order).limit(wanted),
            skip_locked=True,
        )
    ).all()
    out = Token(tat=tat)
    if not heads:
        return out
    due_row = heads[0]
    if token:
        out.tat = clock + timedelta(seconds=rate.interval)
        head, due_row = heads[0], (heads[1] if len(heads) > 1 else None)
        out.released = [head]
        if head.due_at is not None:  # held back by the rate at least once: its time waiting
            out.throttled = max(0.0, (clock - (aware(head.dispatched_at) or clock)).total_seconds())
    _due(tx, name, digest, due_row, out.tat)
    return out


def _due(tx: Any, name: str, digest: str, row: Any, due: datetime | None) -> None:
    """``row`` (None: none) waits for the token due at ``due``; no other row of the limit
    keeps a due time. NOTIFY when the row's due time became earlier (or new)."""
    stale = tx.conn.execute(
        tx.dialect.lock(
            sa.select(_T.execution_id, _T.activity_id).where(_of(name, digest) & _T.due_at.is_not(None)),
            skip_locked=True,
        )
    ).all()
    for other in stale:
        if row is None or (other.execution_id, other.activity_id) != (row.execution_id, row.activity_id):
            tx.conn.execute(activity_tasks.update().where(_pk(other)).values(due_at=None))
    if row is None or due is None:
        return
    before = aware(row.due_at)
    if before != due:
        tx.conn.execute(activity_tasks.update().where(_pk(row)).values(due_at=due))
    if before is None or due < before:
        tx.dialect.notify_due(tx.conn, due.timestamp())


def clear_due(tx: Any, name: str) -> None:
    """No rate is in force for ``name`` any more (an override cleared, a rate dropped from the
    decorator): its waiting rows keep no due time, or the wakers would keep finding them due
    and release nothing. Rows another transaction holds are skipped: it is releasing or
    abandoning them, and either clears their due time."""
    held = tx.conn.execute(
        tx.dialect.lock(
            sa.select(_T.execution_id, _T.activity_id).where(
                (_T.activity_name == name) & (_T.status == WAITING) & _T.due_at.is_not(None)
            ),
            skip_locked=True,
        )
    ).all()
    for row in held:
        tx.conn.execute(activity_tasks.update().where(_pk(row)).values(due_at=None))


# ── the waker's reads ────────────────────────────────────────────────────────────────────────
def earliest_due(tx: Any) -> tuple[float, float] | None:
    """The earliest due time of a waiting row: seconds from the database's clock to it
    (negative: past due), and the time itself in seconds since the epoch (what a NOTIFY on
    ``harvest_limits_due`` carries); None when no row waits for a token."""
    found = next_due(tx)
    return None if found is None else (found[0], found[1])


def next_due(tx: Any) -> tuple[float, float, str, str] | None:
    """``earliest_due`` with the limit (name, key digest) of the row that is due first: what a
    waker settles directly when its sleep ends, with no read before the release."""
    found = tx.conn.execute(
        sa.select(_T.due_at, _T.activity_name, _T.limit_digest, tx.dialect.clock().label("clock"))
        .where((_T.status == WAITING) & _T.due_at.is_not(None))
        .order_by(_T.due_at)
        .limit(1)
    ).first()
    if found is None:
        return None
    due, clock = aware(found.due_at), aware(found.clock)
    assert due is not None and clock is not None
    return (due - clock).total_seconds(), due.timestamp(), found.activity_name, found.limit_digest


def due_limits(tx: Any, limit: int = 100) -> list[tuple[str, str]]:
    """Every limit with a waiting row whose token is due by the database's clock."""
    rows = tx.conn.execute(
        sa.select(_T.activity_name, _T.limit_digest)
        .where((_T.status == WAITING) & _T.due_at.is_not(None) & (_T.due_at <= tx.dialect.clock()))
        .distinct()
        .limit(limit)
    ).all()
    return [(r.activity_name, r.limit_digest) for r in rows]
