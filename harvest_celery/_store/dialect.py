"""The one place SQLite (embedded mode) and Postgres differ: how an engine is made, whether rows
can be locked, and whether an operation runs as one statement (Postgres: data-modifying CTEs,
``_store.sql``) or as the same steps one by one (SQLite). Everything else in the store is written
once for both, and asks the dialect through these methods, never by testing which one it is."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util import queue as pool_queue

from harvest_celery._store import pgwrite, prepared, sql
from harvest_celery._store.records import utcnow
from harvest_celery._store.schema import WAIT_SEQ, activity_tasks, executions

log = logging.getLogger("harvest_celery")
F = TypeVar("F")
Inserts = Sequence[tuple[sa.Table, Any]]


@dataclass(frozen=True)
class Pools:
    """The sizes of a process's two Postgres pools: the transactions' (``size`` kept open,
    ``overflow`` more opened under load and closed when given back) and the autocommit pool of
    one-statement operations, the claim (``claim_size``, ``claim_overflow``). ``Harvest``'s
    ``pool_size``, ``max_overflow``, ``claim_pool_size`` and ``claim_max_overflow``.

    ``pooled``: the URL reaches Postgres through a transaction pooler (PgBouncer): psycopg 3
    makes no server-side prepared statements (a prepared statement lives in one server session,
    which a pooler hands to another client after each transaction)."""

    # a connection budget (docs/operations.md#connection-pools): a -c 8 worker pair stays well
    # inside Postgres's default max_connections of 100 (at most 8 + 6 + 1 per process). No
    # overflow: QueuePool opens its connections on demand and keeps them, but closes an overflow
    # connection when it is given back, so a busy threads worker on 2 + 6 opened and closed a
    # Postgres backend for most steps (B2 at 64 in flight: 220 steps/s, 368 with 8 + 0)
    size: int = 8
    overflow: int = 0
    claim_size: int = 6
    claim_overflow: int = 0
    pooled: bool = False


DEFAULT_POOLS = Pools()


class Dialect:
    """Postgres: row locks (``FOR UPDATE``, ``SKIP LOCKED`` for the sweeper), a pooled engine."""

    name = "postgresql"
    row_locks = True
    dml_ctes = True  # INSERT … inside an UPDATE's WITH (read only by the methods of this module)

    def create_engine(
        self, url: str, echo: bool, *, autocommit: bool = False, pools: Pools = DEFAULT_POOLS
    ) -> Engine:
        # No pool ping on the hot path: a connection in constant use is not pinged. One idle
        # longer than IDLE_PING seconds (the likely victims of a database restart) is pinged on
        # checkout and replaced if dead; a busy one that died fails its first statement, and
        # ``Store.transaction`` runs the transaction once more when that came before COMMIT.
        # ``autocommit``: a pool for one-statement operations (the claim).
        options: dict[str, Any] = {
            "echo": echo,
            "pool_pre_ping": False,
            "hide_parameters": True,
            "poolclass": WaitingPool,
        }
        options.update(pooler_options(url, pools))
        if autocommit:
            engine = sa.create_engine(
                url,
                pool_size=pools.claim_size,
                max_overflow=pools.claim_overflow,
                isolation_level="AUTOCOMMIT",
                **options,
            )
        else:
            engine = sa.create_engine(url, pool_size=pools.size, max_overflow=pools.overflow, **options)
        _ping_when_idle(engine)
        if engine.dialect.driver == "psycopg2" and not pools.pooled:
            prepared.enable(engine)  # the hot path's autocommit statements keep their plans
        return engine

    def lock(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query.with_for_update(skip_locked=skip_locked)

    def clock(self) -> Any:
        """The database's own time as an SQL expression (schedules fire by it, so host clock
        skew does not matter): Postgres ``clock_timestamp()``, not the transaction's start."""
        return sa.func.clock_timestamp()

    def one_statement(self, in_one: F, stepwise: F) -> F:
        """The form of an operation this database runs (``tasks.claim``, ``tasks.finish_completed``):
        Postgres, its one statement; SQLite, the same steps one by one."""
        return in_one

    def in_one_trip(self, conn: Connection, texts: Sequence[str], params: dict[str, Any]) -> Any:
        """Driver-level statements in order, the last one's result (``limits.settle``):
        psycopg2 sends them as one simple query, one round trip, each statement still with its
        own snapshot; psycopg 3 (server-side parameters) sends them one by one."""
        if conn.dialect.driver == "psycopg2":
            return prepared.execute(conn, texts, params)
        for text in texts[:-1]:
            conn.exec_driver_sql(text, params)
        return conn.exec_driver_sql(texts[-1], params)

    def autocommits(self, one_statement: bool) -> bool:
        """A transaction of one statement runs in autocommit: one round trip, no BEGIN/COMMIT."""
        return one_statement

    def trip_commits_together(self, driver: str) -> bool:
        """Do the statements of one trip (``in_one_trip``) in autocommit commit together? With
        psycopg2 they are one simple query: one implicit transaction (a limited workflow's close
        and its admission's settle, ``admission.close_in_one_trip``). psycopg 3 sends them one
        by one, each its own transaction."""
        return driver == "psycopg2"

    def completes_in_one_statement(self) -> bool:
        """An activity's completion and the decision on it can be one guarded statement
        (``Tx.apply_guarded_decision``)."""
        return self.dml_ctes

    def write_run(
        self, conn: Connection, execution_id: str, inserts: Inserts, values: dict[str, Any]
    ) -> None:
        """A run write (``Tx.write``): the inserts as data-modifying CTEs of the run-row UPDATE, ONE
        statement. The hot path's shapes go as plain SQL cached by shape (``pgwrite``); anything
        else through Core."""
        fast = pgwrite.statement(execution_id, inserts, values)
        if fast is not None:
            conn.exec_driver_sql(*fast)
            return
        ctes = [table.insert().values(rows).cte(f"new_{table.name}") for table, rows in inserts]
        update = update_run(execution_id, values)
        conn.execute(update.add_cte(*ctes) if ctes else update)

    def read_only(self, conn: Connection) -> None:
        """Make the transaction just begun on ``conn`` a read-only one on one snapshot (its first
        statement): a read that must agree with itself and can write nothing (``Store.snapshot``)."""
        conn.exec_driver_sql(sql.READ_ONLY_SNAPSHOT)

    def insert_ignore(self, table: Any) -> Any:
        """INSERT that skips a row whose key exists (a record written twice is written once)."""
        return postgresql.insert(table).on_conflict_do_nothing()

    def next_wait_seq(self, conn: Connection) -> int:
        """The next wait order of a limited row (``harvest_wait_seq``): FIFO within a priority."""
        return int(conn.execute(sa.select(WAIT_SEQ.next_value())).scalar_one())

    def notify(self, conn: Any, execution_id: str) -> None:
        """Wake waiters of the run once this transaction commits (``_store.listener``)."""
        conn.execute(sql.NOTIFY, {"execution_id": execution_id})

    def announce_start(self, conn: Any, notice: str) -> None:
        """A start written in an application's transaction: heard by the decision workers once
        (and only if) that transaction commits (``_store.starts``)."""
        conn.execute(sql.ANNOUNCE, {"notice": notice})

    def notify_due(self, conn: Any, due: float) -> None:
        """A rate limit's next token time, written: every sweeper's waker sleeping past it wakes
        once this transaction commits (``_runtime.waker``)."""
        conn.execute(sql.NOTIFY_DUE, {"due": repr(due)})


class SqliteDialect(Dialect):
    """Embedded mode: one process, one writer at a time; no row locks (SQLite locks the file)."""

    name = "sqlite"
    row_locks = False
    dml_ctes = False

    def create_engine(
        self, url: str, echo: bool, *, autocommit: bool = False, pools: Pools = DEFAULT_POOLS
    ) -> Engine:
        engine = sa.create_engine(
            url, echo=echo, hide_parameters=True, connect_args={"check_same_thread": False, "timeout": 30}
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA foreign_keys=ON")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

        return engine

    def lock(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query

    def clock(self) -> Any:
        return sa.literal(utcnow(), sa.DateTime(timezone=True))  # one process: its own clock

    def one_statement(self, in_one: F, stepwise: F) -> F:
        return stepwise

    def autocommits(self, one_statement: bool) -> bool:
        return False

    def trip_commits_together(self, driver: str) -> bool:
        return False

    def write_run(
        self, conn: Connection, execution_id: str, inserts: Inserts, values: dict[str, Any]
    ) -> None:
        """One statement per table, then the run-row update."""
        for table, rows in inserts:
            conn.execute(table.insert(), rows)
        if values:
            conn.execute(update_run(execution_id, values))

    def read_only(self, conn: Connection) -> None:
        """One process, one writer at a time: the reads of one transaction agree already, and the
        caller issues no write."""

    def insert_ignore(self, table: Any) -> Any:
        return sqlite.insert(table).on_conflict_do_nothing()

    def next_wait_seq(self, conn: Connection) -> int:
        """One writer at a time (the file lock): the highest order so far, plus one."""
        top = conn.execute(sa.select(sa.func.max(activity_tasks.c.wait_seq))).scalar()
        return int(top or 0) + 1

    def notify(self, conn: Any, execution_id: str) -> None:
        """One process: its waiters poll (embedded mode drains before it reads)."""

    def announce_start(self, conn: Any, notice: str) -> None:
        """No listener: the application's after-commit hook, or the sweeper, requests it."""

    def notify_due(self, conn: Any, due: float) -> None:
        """One process: its waker re-reads the earliest due time after every sweep."""


def pooler_options(url: str, pools: Pools) -> dict[str, Any]:
    """Behind a transaction pooler, psycopg 3 never prepares on the server (psycopg2 never does)."""
    if pools.pooled and sa.engine.make_url(url).get_driver_name() == "psycopg":
        return {"connect_args": {"prepare_threshold": None}}
    return {}


def update_run(execution_id: str, values: dict[str, Any]) -> Any:
    return (
        executions.update()
        .where(executions.c.id == execution_id)
        .values(**(values or {"next_seq": executions.c.next_seq}))
    )


IDLE_PING = 30.0  # seconds a pooled connection may sit unused before it is pinged on checkout


def _ping_when_idle(engine: Engine) -> None:
    @sa.event.listens_for(engine, "checkin")
    def _checked_in(_dbapi: Any, record: Any) -> None:
        record.info["harvest_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("harvest_idle_since")
        if since is None or time.monotonic() - since < IDLE_PING:
            return
        try:
            with dbapi.cursor() as cursor:
                cursor.execute(sql.PING)
            if not dbapi.autocommit:
                dbapi.rollback()
        except Exception as exc:  # noqa: BLE001 - dead: the pool replaces it and tries again
            raise sa.exc.DisconnectionError() from exc


# A connection the server refuses for want of a slot (max_connections, a role's or database's
# CONNECTION LIMIT) is not an error for the caller: it waits for one of its pool's connections to
# be given back, or for the server to accept it, with jittered backoff, for up to SLOT_WAIT
# seconds — as long as SQLAlchemy's pool waits when it is full (pool_timeout) — before raising.
# Running out of connections makes a claim or a decision slower, never a failed attempt.
SLOT_WAIT = 30.0
NO_SLOT = ("too many connections", "too many clients", "remaining connection slots")


def no_slot(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a connection for want of a slot."""
    text = str(exc).lower()
    return any(marker in text for marker in NO_SLOT)


class WaitingPool(QueuePool):
    """A ``QueuePool`` that waits out a server with no slot left (``SLOT_WAIT``), and says so
    in the log at most once a minute per pool."""

    _told = -60.0

    def _do_get(self) -> Any:
        deadline = time.monotonic() + SLOT_WAIT
        pause = 0.05
        while True:
            try:
                return super()._do_get()
            except Exception as exc:
                if not no_slot(exc) or time.monotonic() >= deadline:
                    raise
                if time.monotonic() - self._told >= 60.0:
                    self._told = time.monotonic()
                    log.warning("harvest: Postgres has no connection slot left (%s); waiting for one", exc)
            try:  # a connection given back meanwhile, or try the server again after the pause
                return self._pool.get(True, pause * random.uniform(0.5, 1.5))
            except pool_queue.Empty:
                pause = min(pause * 2, 1.0)


def dialect_for(url: str) -> Dialect:
    return SqliteDialect() if url.startswith("sqlite") else Dialect()
