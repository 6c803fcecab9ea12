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

from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from harvest_celery._store.schema import executions, metadata

_DIALECT = postgresql.psycopg2.dialect()  # type: ignore[attr-defined]

Rows = Sequence[dict[str, Any]]
Shape = tuple[tuple[tuple[str, tuple[str, ...], int], ...], tuple[str, ...]]


def statement(execution_id: str, inserts: Sequence[tuple[sa.Table, Rows]],
              values: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The SQL and parameters of one run write, or None when Core must build it."""
    if any(isinstance(v, sa.ClauseElement) for v in values.values()):
        return None
    tables = []
    for table, rows in inserts:
        columns = tuple(rows[0])
        if any(tuple(row) != columns for row in rows):
            return None
        tables.append((table.name, columns, len(rows)))
    shape: Shape = (tuple(tables), tuple(values))
    params: dict[str, Any] = {"run_id": execution_id}
    for t, (table, rows) in enumerate(inserts):
        for r, row in enumerate(rows):
            for name, value in row.items():
                params[f"t{t}r{r}_{name}"] = _bind(table.name, name)(value)
    for name, value in values.items():
        params[f"v_{name}"] = _bind(executions.name, name)(value)
    return _text(shape), params


@lru_cache(maxsize=256)
def _text(shape: Shape) -> str:
    tables, columns = shape
    ctes = []
    for t, (table, names, count) in enumerate(tables):
        rows = ", ".join("(" + ", ".join(f"%(t{t}r{r}_{n})s" for n in names) + ")"
                         for r in range(count))
        cols = ", ".join(_quote(n) for n in names)
        ctes.append(f"new_{table} AS (INSERT INTO {table} ({cols}) VALUES {rows})")
    sets = ", ".join(f"{_quote(n)} = %(v_{n})s" for n in columns) or "next_seq = next_seq"
    head = f"WITH {', '.join(ctes)} " if ctes else ""
    return f"{head}UPDATE {executions.name} SET {sets} WHERE id = %(run_id)s"


def _quote(name: str) -> str:
    return str(_DIALECT.identifier_preparer.quote(name))


@cache
def _bind(table: str, column: str) -> Callable[[Any], Any]:
    """The column type's bind processor (JSON → its serialised text), or identity."""
    process = metadata.tables[table].c[column].type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
    return process if process is not None else _same


def _same(value: Any) -> Any:
    return value
