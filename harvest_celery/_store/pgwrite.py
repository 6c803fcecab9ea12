"""A run write (``tx.RunWrite``) as one plain-SQL statement for Postgres, cached by its shape.

Why not SQLAlchemy Core here: a multi-row ``INSERT … VALUES`` inside a CTE is not in
SQLAlchemy's compiled cache, so Core compiled the hot path's statement anew for every step —
the largest single cost a profile of a worker showed after the SQL itself. The statement's
*shape* (which tables get how many rows of which columns, which run columns change) repeats
from step to step, so its text is built once per shape (``sql.plain_write``,
``sql.guarded_write``) and sent with ``exec_driver_sql``. Values still go through each column type's own bind processor (JSON is
serialised exactly as Core would, ``None`` included), so what is stored is identical; a test
pins the two paths to the same rows. Anything unusual (a SQL expression as a value, rows of
different columns) returns ``None`` and the caller uses Core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa

from harvest_celery._store import sql
from harvest_celery._store.records import CompletionGuard, RunRow
from harvest_celery._store.schema import executions, metadata
from harvest_celery._store.sql import DIALECT, Shape

Rows = Sequence[dict[str, Any]]


def statement(
    execution_id: str, inserts: Sequence[tuple[sa.Table, Rows]], values: dict[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """The SQL and parameters of one run write, or None when Core must build it."""
    found = _shape_and_params(execution_id, inserts, values)
    return (sql.plain_write(found[0]), found[1]) if found is not None else None


def guarded(
    row: RunRow,
    inserts: Sequence[tuple[sa.Table, Rows]],
    values: dict[str, Any],
    guard: CompletionGuard,
    now: datetime,
    *,
    closing: tuple[datetime, str] | None = None,
    notify: bool = False,
) -> tuple[str, dict[str, Any]] | None:
    """A completion and its decision as ONE statement that writes only while ``guard`` holds
    (``records.CompletionGuard``, ``predicates.fast_path``: ``sql.GUARD``): the run row is
    locked and checked against ``row`` (its next seq and sticky queue; live, nothing pending),
    the attempt's task row closed, and the
    inserts and the run update happen only if both did. Its row count is 1 when written, 0
    when not. In autocommit it is a whole step's commit in one round trip.

    ``closing``: the run closes — its unstarted task rows are abandoned with that reason and its
    timers stopped (the caller writes no new task row or timer then: a sibling CTE cannot see
    them). ``notify``: wake the run's waiters on commit."""
    found = _shape_and_params(row.id, inserts, values)
    if found is None:
        return None
    shape, params = found
    params.update(
        g_next_seq=row.next_seq,
        g_sticky_queue=row.sticky_queue,
        g_now=now,
        g_activity_id=guard.activity_id,
        g_attempt=guard.attempt,
    )
    if closing is not None:
        params.update(g_closed_at=closing[0], g_why=closing[1])
    return sql.guarded_write(shape, closing is not None, notify), params


def _shape_and_params(
    execution_id: str, inserts: Sequence[tuple[sa.Table, Rows]], values: dict[str, Any]
) -> tuple[Shape, dict[str, Any]] | None:
    """A write's shape (what its cached text depends on) and its bound parameters."""
    if any(isinstance(v, sa.ClauseElement) for v in values.values()):
        return None
    tables = []
    for table, rows in inserts:
        columns = tuple(rows[0])
        if any(tuple(row) != columns for row in rows):
            return None
        tables.append((table.name, columns, len(rows)))
    params: dict[str, Any] = {"run_id": execution_id}
    for t, (table, rows) in enumerate(inserts):
        for r, row in enumerate(rows):
            for name, value in row.items():
                params[f"t{t}r{r}_{name}"] = _bind(table.name, name)(value)
    for name, value in values.items():
        params[f"v_{name}"] = _bind(executions.name, name)(value)
    return (tuple(tables), tuple(values)), params


@cache
def _bind(table: str, column: str) -> Callable[[Any], Any]:
    """The column type's bind processor (JSON → its serialised text), or identity."""
    process = metadata.tables[table].c[column].type.dialect_impl(DIALECT).bind_processor(DIALECT)
    return process if process is not None else _same


def _same(value: Any) -> Any:
    return value


def outcome_unknown(exc: BaseException) -> bool:
    """Did an autocommit statement fail in a way that leaves its commit unknown (the connection
    went, or a signal interrupted it)? Then its blobs stay: its rows may reference them (an
    orphan is deleted when the run is erased or purged)."""
    if not isinstance(exc, Exception):
        return True
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
