"""The hot path's autocommit statements from server-side prepared statements (psycopg2).

psycopg2 interpolates parameters on the client and sends a simple query, which Postgres parses
and plans afresh every time. For the guarded one-statement write, the claim and a limited
step's hand-off, planning cost about three times their execution (``EXPLAIN (ANALYZE,
SUMMARY)``: an unlimited six-step run 3.8 ms of planning against 1.1 ms of execution), and it
is Postgres CPU on every step. So each text is ``PREPARE``d once per connection (its
``%(name)s`` parameters become ``$n``, their types inferred by Postgres from where they stand)
and run as ``EXECUTE name(...)``: Postgres plans it a few times, then keeps a generic plan. The
statements of one trip are still one simple query, one implicit transaction.

Only where it is safe:

* on a connection of harvest's own engines (``enable``: psycopg2, and not behind a transaction
  pooler, ``Pools.pooled``: a prepared statement lives in one server session, which a pooler
  hands to other clients) — never on an application's connection;
* in autocommit only, so a ``PREPARE`` that fails aborts no transaction: the text is then
  remembered as not preparable and sent as before;
* a failed ``EXECUTE`` forgets every statement prepared on that connection (``DEALLOCATE
  ALL``). One refused before anything ran (a prepared statement gone, a cached plan whose
  result type a migration changed) is sent again as plain text; any other error (a lost
  connection: the outcome may be unknown) goes to the caller, which handles it as it handles
  any failed statement.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg2 as _psycopg2
from sqlalchemy.engine import Connection, Engine

_PSYCOPG2 = _psycopg2.dialect()
log = logging.getLogger("harvest_celery")

_ON = "harvest_prepare"  # connection-record info: this connection may prepare
_CACHE = "harvest_prepared"  # connection-record info: text -> (name, parameter order) or None
SIZE = 256  # statements kept per connection (the least recently used is deallocated)
_PARAMETER = re.compile(r"%\((\w+)\)s")
# SQLSTATEs of an EXECUTE refused before anything ran (its implicit transaction rolled back, so
# the plain text may be sent instead): a prepared statement gone (26000), a cached plan whose
# result type a migration changed (0A000)
_REFUSED = {"26000", "0A000"}

# what a connection knows of a text: False, seen once (sent as text: a one-off text costs no
# PREPARE, and Postgres keeps a generic plan only after a few executions anyway); None, not
# preparable (sent as text); else its statement's name and parameter order
Prepared = tuple[str, tuple[str, ...]] | bool | None


def enable(engine: Engine) -> None:
    """Let ``engine``'s connections prepare (``Dialect.create_engine``: psycopg2, not pooled)."""

    @sa.event.listens_for(engine, "connect")
    def _connected(_dbapi: Any, record: Any) -> None:
        record.info[_ON] = True


def execute(conn: Connection, texts: Sequence[str], params: dict[str, Any]) -> Any:
    """``texts`` (pyformat, ``%(name)s``) in one simple query, in order; the last one's result,
    as ``conn.exec_driver_sql(";\\n".join(texts), params)`` gives it."""
    info = conn.connection.info
    dbapi = conn.connection.dbapi_connection
    if not info.get(_ON) or dbapi is None or not getattr(dbapi, "autocommit", False):
        return conn.exec_driver_sql(";\n".join(texts), params)
    cache: OrderedDict[str, Prepared] = info.setdefault(_CACHE, OrderedDict())
    calls, plain = [], False
    for text in texts:
        if text not in cache:
            cache[text] = False  # seen once
            _evict(dbapi, cache)
        elif cache[text] is False:
            _prepare(dbapi, cache, text)  # its second use
        cache.move_to_end(text)
        prepared = cache[text]
        if not isinstance(prepared, tuple):
            plain = True
            continue
        name, order = prepared
        calls.append(
            f"EXECUTE {name}({', '.join(f'%({p})s' for p in order)})" if order else f"EXECUTE {name}"
        )
    if plain:
        return conn.exec_driver_sql(";\n".join(texts), params)
    try:
        return conn.exec_driver_sql(";\n".join(calls), params)
    except sa.exc.DBAPIError as exc:
        forget(conn)
        if getattr(exc.orig, "pgcode", None) in _REFUSED:  # refused whole, nothing ran: as before
            return conn.exec_driver_sql(";\n".join(texts), params)
        raise


def text(conn: Connection, clause: sa.TextClause, params: dict[str, Any]) -> Any:
    """``conn.execute(clause, params)`` for an ``sa.text`` of ``:name`` parameters (plain values,
    no bind types: what ``conn.execute`` would hand psycopg2), through ``execute``."""
    return execute(conn, [_pyformat(clause)], params)


@functools.cache
def _pyformat(clause: sa.TextClause) -> str:
    return str(clause.compile(dialect=_PSYCOPG2))


def forget(conn: Connection) -> None:
    """Drop every statement this connection prepared (after a failed ``EXECUTE``)."""
    conn.connection.info.pop(_CACHE, None)
    dbapi = conn.connection.dbapi_connection
    try:
        with dbapi.cursor() as cur:  # type: ignore[union-attr]
            cur.execute("DEALLOCATE ALL")
    except Exception:  # noqa: BLE001,S110 - a dead connection: the pool replaces it
        pass


def body(text: str) -> tuple[str, tuple[str, ...]]:
    """A pyformat text as a ``PREPARE`` body: each distinct ``%(name)s`` a ``$n`` in order of
    first appearance, ``%%`` a plain ``%``; and the parameter names in ``$n`` order."""
    order: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in order:
            order.append(m.group(1))
        return f"${order.index(m.group(1)) + 1}"

    return _PARAMETER.sub(number, text).replace("%%", "%"), tuple(order)


def _prepare(dbapi: Any, cache: OrderedDict[str, Prepared], text: str) -> None:
    sql, order = body(text)
    name = "harvest_" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:20]
    try:
        with dbapi.cursor() as cur:  # no parameters: psycopg2 sends it as it is
            cur.execute(f"PREPARE {name} AS {sql}")
        cache[text] = (name, order)
    except Exception as exc:  # noqa: BLE001 - not preparable (a type Postgres cannot infer): sent as before
        log.debug("not prepared (%s): %s", exc, text[:200])
        cache[text] = None


def _evict(dbapi: Any, cache: OrderedDict[str, Prepared]) -> None:
    """Past ``SIZE`` texts, the least recently used go (their statements deallocated)."""
    while len(cache) > SIZE:
        _, prepared = cache.popitem(last=False)
        if isinstance(prepared, tuple):
            try:
                with dbapi.cursor() as cur:
                    cur.execute(f"DEALLOCATE {prepared[0]}")
            except Exception:  # noqa: BLE001,S110 - gone with its connection
                pass
