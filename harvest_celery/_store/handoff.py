"""A limited activity's completion in one round trip (docs/flow-control.md, "The hand-off").

An activity under a concurrency limit (no rate) completes like an unlimited one — its completion
and the decision on it in one guarded statement (``sql.guarded_write``) — followed, in the same
simple query and so in the same implicit transaction, by the hand-off of the slot it held to the
next waiting row of its limit and key (``sql.HAND_OFF_AFTER_WRITE``), without the limit row's
lock: one row leaves the count and one enters it in the same commit. That next row may be the
run's own next step under the same limit and key, written ``waiting`` by this very statement
with its wait order from the sequence: if the hand-off releases it, it is claimed for the
deciding thread there (eager). A slot nobody takes is settled under the lock in a transaction
of its own once this one committed (``Tx.settle_after``, ``Store.transaction``). Any other
limited dispatch in the decision takes the ordinary transaction (``_store.limits``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from harvest_celery._core.limits import Limits, limit_key_of
from harvest_celery._core.registry import Registry
from harvest_celery._errors import InvalidLimitKey
from harvest_celery._payloads.digest import limit_digest
from harvest_celery._store import limits, prepared, sql
from harvest_celery._store.schema import WAIT_SEQ
from harvest_celery._store.staging import EagerTake

# Limit names whose own row this process has declared (``declare_once``): the row is never
# deleted, so a one-trip completion declares it at most once per process.
_DECLARED: set[str] = set()
# The wait order a one-trip write takes from the sequence in its own statement (``in_line``).
FROM_SEQUENCE = -1
UNKNOWN_KEY = "?"  # a slot whose key could not be computed again: matches no next step's digest


def slot(registry: Registry, name: str, input: Any) -> tuple[str, str] | None:
    """The limit and key whose slot an attempt of ``name`` holds (None: unlimited, or under a
    declared rate: its token is settled in the lock order). Its key from the attempt's input, as
    the dispatch computed it; a key that cannot be computed again matches no next step."""
    spec = registry.activity(name).limits
    if spec.concurrency is None or spec.rate_limit is not None:
        return None
    try:
        return name, limit_digest(name, limit_key_of(name, spec, input))
    except InvalidLimitKey:
        return name, UNKNOWN_KEY


def declare_once(tx: limits.Tx, name: str, spec: Limits) -> None:
    """``limits.declare``, once per process and name (a one-trip completion's next step)."""
    if name not in _DECLARED:
        limits.declare(tx, name, spec)
        _DECLARED.add(name)


def in_line_rows(tx: limits.Tx, tasks: list[dict[str, Any]], registry: Registry) -> None:
    """A one-trip write's next step under the same limit: its limit declared, its place in
    line taken from the sequence in the write itself (``in_line``)."""
    for task in tasks:
        if task["limit_digest"] is not None:
            declare_once(tx, task["activity_name"], registry.activity(task["activity_name"]).limits)
            task["wait_seq"] = FROM_SEQUENCE


def in_line(text: str, params: dict[str, Any]) -> str:
    """A one-trip write's text with each ``FROM_SEQUENCE`` wait order taken from the sequence
    in the statement itself (no round trip of its own)."""
    for key in [k for k, v in params.items() if k.endswith("_wait_seq") and v == FROM_SEQUENCE]:
        text = text.replace(f"CAST(%({key})s AS BIGINT)", f"nextval('{WAIT_SEQ.name}')")
        del params[key]
    return text


def write(tx: Any, guarded: tuple[str, dict[str, Any]], taking: EagerTake | None, now: datetime) -> bool:
    """The guarded write and the hand-off of its slot, in one trip (``Tx`` in autocommit): False
    when the guard refused the write (nothing was handed on). The released row is staged, or
    claimed for the deciding thread (``taking``); when none was, the freed slot is settled under
    the lock once this commits (``settle_after``), never taking the thread's row: that would
    lock its run row after the limit row."""
    text, params = guarded
    text = in_line(text, params)
    params.update(limits.candidate(taking), now=now)
    tx.eager_take = taking
    rows: list[sa.Row[Any]] = list(prepared.execute(tx.conn, [text, sql.HAND_OFF_AFTER_WRITE], params).all())
    name, digest = rows[0].limit_name, rows[0].limit_digest
    if name is None:
        tx.eager_take = None
        return False
    if limits.dispatch_released(tx, [r for r in rows if r.execution_id is not None]) == 0:
        tx.eager_take = None
        tx.settle_after.add((name, digest))
    return True
