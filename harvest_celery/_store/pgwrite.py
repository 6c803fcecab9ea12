"""A run write (``tx.RunWrite``) as one plain-SQL statement for Postgres, cached by its shape.

Why not SQLAlchemy Core here: a multi-row ``INSERT … VALUES`` inside a CTE is not in
SQLAlchemy's compiled cache, so Core compiled the hot path's statement anew for every step —
the largest single cost a profile of a worker showed after the SQL itself. The statement's
*shape* (which tables get how many rows of which columns, which run columns change) repeats
from step to step, so its text is built once per shape here and sent with
``exec_driver_sql``. Values still go through each column type's own bind processor (JSON is
serialised exactly as Core would, ``None`` included), so what is stored is identical; a test
pins the two paths to the same rows. Anything unusual (a SQL expression as a value, rows of
different columns) returns ``None`` and the caller uses Core.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache, lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from harvest_celery._store.records import CompletionGuard, RunRow
from harvest_celery._store.schema import activity_tasks, executions, metadata, timers

_DIALECT = postgresql.psycopg2.dialect()  # type: ignore[attr-defined]

Rows = Sequence[dict[str, Any]]
Shape = tuple[tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]]


def statement(execution_id: str, inserts: Sequence[tuple[sa.Table, Rows]],
              values: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The SQL and parameters of one run write, or None when Core must build it."""
    found = _shape_and_params(execution_id, inserts, values)
    return (_text(found[0]), found[1]) if found is not None else None


def guarded(row: RunRow, inserts: Sequence[tuple[sa.Table, Rows]], values: dict[str, Any],
            guard: CompletionGuard, now: datetime, *, closing: tuple[datetime, str] | None = None,
            notify: bool = False) -> tuple[str, dict[str, Any]] | None:
    """A completion and its decision as ONE statement that writes only while ``guard`` holds
    (``records.CompletionGuard``): the run row is locked and checked against ``row`` (its next
    seq and sticky queue; live, nothing pending), the attempt's task row closed, and the
    inserts and the run update happen only if both did. Its row count is 1 when written, 0
    when not. In autocommit it is a whole step's commit in one round trip.

    ``closing``: the run closes — its unstarted task rows are abandoned with that reason and its
    timers stopped (the caller writes no new task row or timer then: a sibling CTE cannot see
    them). ``notify``: wake the run's waiters on commit."""
    found = _shape_and_params(row.id, inserts, values)
    if found is None:
        return None
    shape, params = found
    params.update(g_next_seq=row.next_seq, g_sticky=row.sticky_queue, g_now=now,
                  g_activity_id=guard.activity_id, g_attempt=guard.attempt)
    if closing is not None:
        params.update(g_closed_at=closing[0], g_why=closing[1])
    return _guarded_text(shape, closing is not None, notify), params


def _shape_and_params(execution_id: str, inserts: Sequence[tuple[sa.Table, Rows]],
                      values: dict[str, Any]) -> tuple[Shape, dict[str, Any]] | None:
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


_GUARD = f"""run AS (
    SELECT id FROM {executions.name}
    WHERE id = %(run_id)s AND next_seq = %(g_next_seq)s AND status = 'RUNNING'
      AND cancelled_at IS NULL AND cancel_requested_at IS NULL AND decision_requested_at IS NULL
      AND paused_at IS NULL AND erased_at IS NULL AND nd_blocked_at IS NULL AND nd_retry_at IS NULL
      AND sticky_queue IS NOT DISTINCT FROM %(g_sticky)s
    FOR UPDATE
), done AS (
    UPDATE {activity_tasks.name} AS t
    SET status = 'completed', finished_at = %(g_now)s, lease_expires_at = NULL
    FROM run
    WHERE t.execution_id = run.id AND t.activity_id = %(g_activity_id)s
      AND t.attempt = %(g_attempt)s AND t.status = 'running'
    RETURNING t.execution_id
)"""


_CLOSING = f"""abandoned AS (
    UPDATE {activity_tasks.name} AS a
    SET status = 'cancelled', finished_at = %(g_closed_at)s, last_error = %(g_why)s
    FROM done WHERE a.execution_id = done.execution_id AND a.status IN ('scheduled', 'retry_wait')
), stopped AS (
    UPDATE {timers.name} AS tm SET fired = true FROM done WHERE tm.execution_id = done.execution_id
)"""
_NOTIFY = "notified AS (SELECT pg_notify('harvest_runs', %(run_id)s) FROM done)"


@lru_cache(maxsize=256)
def _guarded_text(shape: Shape, closing: bool, notify: bool) -> str:
    tables, columns = shape
    ctes = [_GUARD] + ([_CLOSING] if closing else []) + ([_NOTIFY] if notify else [])
    for t, (table, names, count) in enumerate(tables):
        ctes.append(f"new_{table} AS (INSERT INTO {table} ({_columns(names)}) SELECT v.* FROM "
                    f"(VALUES {_rows(t, table, names, count, cast=True)}) AS v, done)")
    sets = ", ".join(f"{_quote(n)} = %(v_{n})s" for n in columns) or "next_seq = e.next_seq"
    sources = "done, notified" if notify else "done"  # a plain CTE runs only if read
    return (f"WITH {', '.join(ctes)} UPDATE {executions.name} AS e SET {sets} "
            f"FROM {sources} WHERE e.id = done.execution_id")


def _type(table: str, column: str) -> str:
    """The column's type for a CAST in VALUES, without a length: an explicit cast to
    VARCHAR(n) would silently truncate, where the INSERT itself refuses an over-long value."""
    return re.sub(r"\(\d+\)", "", str(metadata.tables[table].c[column].type.compile(dialect=_DIALECT)))


@lru_cache(maxsize=256)
def _text(shape: Shape) -> str:
    tables, columns = shape
    ctes = []
    for t, (table, names, count) in enumerate(tables):
        ctes.append(f"new_{table} AS (INSERT INTO {table} ({_columns(names)}) "
                    f"VALUES {_rows(t, table, names, count, cast=False)})")
    sets = ", ".join(f"{_quote(n)} = %(v_{n})s" for n in columns) or "next_seq = next_seq"
    head = f"WITH {', '.join(ctes)} " if ctes else ""
    return f"{head}UPDATE {executions.name} SET {sets} WHERE id = %(run_id)s"


def _rows(t: int, table: str, names: tuple[str, ...], count: int, *, cast: bool) -> str:
    """``count`` VALUES rows of table ``t``'s parameters; cast to the column types where the
    rows stand in a SELECT (no INSERT target to coerce them)."""
    cells = [f"CAST(%(t{t}r{{r}}_{n})s AS {_type(table, n)})" if cast else f"%(t{t}r{{r}}_{n})s"
             for n in names]
    return ", ".join("(" + ", ".join(cell.format(r=r) for cell in cells) + ")" for r in range(count))


def _columns(names: tuple[str, ...]) -> str:
    return ", ".join(_quote(n) for n in names)


def _quote(name: str) -> str:
    return str(_DIALECT.identifier_preparer.quote(name))


@cache
def _bind(table: str, column: str) -> Callable[[Any], Any]:
    """The column type's bind processor (JSON → its serialised text), or identity."""
    process = metadata.tables[table].c[column].type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
    return process if process is not None else _same


def _same(value: Any) -> Any:
    return value
