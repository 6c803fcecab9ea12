"""The one place SQLite (embedded mode) and Postgres differ: how an engine is made and whether
rows can be locked. Everything else in the store is written once for both."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine


class Dialect:
    """Postgres: row locks (``FOR UPDATE``, ``SKIP LOCKED`` for the sweeper), a pooled engine."""

    name = "postgresql"
    row_locks = True
    dml_ctes = True  # INSERT … inside an UPDATE's WITH: one round trip for a whole run write

    def create_engine(self, url: str, echo: bool, *, autocommit: bool = False) -> Engine:
        # No pool ping: a connection that died while idle fails its first statement, and the
        # transaction is retried once (``Store.transaction``) when that happened before COMMIT
        # was sent. ``autocommit``: a pool for one-statement operations (the claim).
        if autocommit:
            return sa.create_engine(url, echo=echo, pool_pre_ping=False, pool_size=2,
                                    max_overflow=10, hide_parameters=True,
                                    isolation_level="AUTOCOMMIT")
        return sa.create_engine(url, echo=echo, pool_pre_ping=False, pool_size=5, max_overflow=10,
                                hide_parameters=True)

    def lock(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query.with_for_update(skip_locked=skip_locked)

    def insert_ignore(self, table: Any) -> Any:
        """INSERT that skips a row whose key exists (a record written twice is written once)."""
        return postgresql.insert(table).on_conflict_do_nothing()

    def notify(self, conn: Any, execution_id: str) -> None:
        """Wake waiters of the run once this transaction commits (``_store.listener``)."""
        conn.execute(sa.text("SELECT pg_notify('harvest_runs', :execution_id)"),
                     {"execution_id": execution_id})

    def announce_start(self, conn: Any, notice: str) -> None:
        """A start written in an application's transaction: heard by the decision workers once
        (and only if) that transaction commits (``_store.starts``)."""
        conn.execute(sa.text("SELECT pg_notify('harvest_runs_started', :notice)"), {"notice": notice})


class SqliteDialect(Dialect):
    """Embedded mode: one process, one writer at a time; no row locks (SQLite locks the file)."""

    name = "sqlite"
    row_locks = False
    dml_ctes = False

    def create_engine(self, url: str, echo: bool, *, autocommit: bool = False) -> Engine:
        engine = sa.create_engine(url, echo=echo, hide_parameters=True,
                                  connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA foreign_keys=ON")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")

        return engine

    def lock(self, query: Any, *, skip_locked: bool = False) -> Any:
        return query

    def insert_ignore(self, table: Any) -> Any:
        return sqlite.insert(table).on_conflict_do_nothing()

    def notify(self, conn: Any, execution_id: str) -> None:
        """One process: its waiters poll (embedded mode drains before it reads)."""

    def announce_start(self, conn: Any, notice: str) -> None:
        """No listener: the application's after-commit hook, or the sweeper, requests it."""


def dialect_for(url: str) -> Dialect:
    return SqliteDialect() if url.startswith("sqlite") else Dialect()
