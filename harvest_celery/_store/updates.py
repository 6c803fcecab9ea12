"""Updates, the store side (docs/concepts.md, "Updates"): accepting one under the run's lock, and
reading its outcome back.

``accept`` is one transaction: lock the chain's current run (``links.lock_current``, as a signal
is routed); an update id already accepted is answered with its run and nothing else happens;
else the run must accept updates (``predicates.accepts_updates``), the caller's ``validate``
runs on the stored history (a probe replay: nothing is written if it raises), and then
``UpdateAccepted`` is appended, the ``harvest_workflow_updates`` row inserted and a decision
requested. The primary key of that row makes two concurrent calls with one id accept once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._errors import ExecutionNotFound, InvalidState
from harvest_celery._store import links
from harvest_celery._store.predicates import accepts_updates
from harvest_celery._store.records import RunRow
from harvest_celery._store.schema import events, workflow_updates
from harvest_celery._store.tx import Tx

Validate = Callable[[RunRow, list[ev.HistoryEvent]], None]


def state_of(row: RunRow) -> str:
    """Why the run refuses an update, in one word (``InvalidState.status``)."""
    if row.erased_at is not None:
        return "erased"
    if row.status != RUNNING:
        return row.status
    if row.cancelled_at is not None:
        return "sealed"
    if row.paused_at is not None:
        return "paused"
    return "nd-blocked" if row.nd_blocked_at is not None else row.status


def accept(
    tx: Tx,
    execution_id: str,
    update_id: str,
    name: str,
    arg: Any,
    now: datetime,
    decision_queue: str,
    validate: Validate,
) -> tuple[str, bool]:
    """Accept the update (module docstring). Returns the run that holds it and whether this
    call accepted it (False: the id was accepted before; nothing was run or written)."""
    row = links.lock_current(tx, execution_id)
    if row is None:
        raise ExecutionNotFound(execution_id)
    earlier = accepted_on(tx, {execution_id, row.id}, update_id)
    if earlier is not None:
        return earlier, False
    if not accepts_updates.holds(row):
        raise InvalidState(execution_id, state_of(row), "send an update to")
    validate(row, tx.history(row.id))
    tx.append(row, [ev.UpdateAccepted(update_id, name, arg)], now, decide_on=decision_queue)
    tx.conn.execute(
        workflow_updates.insert().values(execution_id=row.id, update_id=update_id, name=name, accepted_at=now)
    )
    return row.id, True


def accepted_on(tx: Tx, runs: set[str], update_id: str) -> str | None:
    """The run among ``runs`` that accepted ``update_id``, if one did."""
    t = workflow_updates
    q = sa.select(t.c.execution_id).where(t.c.update_id == update_id, t.c.execution_id.in_(sorted(runs)))
    return tx.conn.execute(q).scalar()


def completions(conn: Any, execution_id: str) -> Sequence[Any]:
    """The raw ``UpdateCompleted`` events of a run: (seq, data, recorded_at)."""
    q = (
        sa.select(events.c.seq, events.c.data, events.c.recorded_at)
        .where(events.c.execution_id == execution_id, events.c.type == ev.UpdateCompleted.type)
        .order_by(events.c.seq)
    )
    return list(conn.execute(q))


__all__ = ["accept", "accepted_on", "completions", "state_of"]
