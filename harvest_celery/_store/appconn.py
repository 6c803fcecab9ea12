"""A start written on the application's own connection, inside its transaction
(``Harvest.start_workflow(connection=...)``): what is accepted, and how each kind is written to.

* a SQLAlchemy ``Connection``: a ``Tx`` over it runs the one start (``starts.start``), so the
  SQL is the engine's own; SQLAlchemy has no hook after a Core commit, so the announcement
  (NOTIFY, delivered on commit) is what wakes a decision worker;
* a SQLAlchemy ``Session`` (a ``scoped_session`` such as Flask-SQLAlchemy's ``db.session``
  too): the same on ``session.connection()``, plus the session's ``after_commit`` hook;
* a psycopg2 or psycopg 3 connection: three plain statements (``dbapi``: why not SQLAlchemy);
* a Django connection (``django.db.connection``, ``connections[alias]``) inside
  ``transaction.atomic()``: its psycopg connection, plus Django's ``on_commit`` hook.

The connection must be on the harvest database (the run row, its first event and its blobs go
in the same transaction as the application's rows). Nothing here commits, rolls back or sends:
a rollback leaves no run, no blob and no message; after a commit, the announcement or the hook
has the first decision sent (``starts``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, scoped_session

from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._store import dbapi, starts
from harvest_celery._store.admission import Prepared
from harvest_celery._store.blobs import PostgresPayloadStore
from harvest_celery._store.store import Store
from harvest_celery._store.tx import Tx

log = logging.getLogger("harvest_celery")

OnCommit = Callable[[Callable[[], None]], None]
_PENDING = "harvest_celery.after_commit"  # Session.info key: callbacks for the next commit


@dataclass(frozen=True)
class AppStart:
    """What a start on an application's connection did: ``created`` a new run (False: the id
    existed and the reuse policy accepted it); ``on_commit`` registers a callback to run once the
    application commits (None: the connection offers no such hook)."""

    created: bool
    on_commit: OnCommit | None


def start_on(
    connection: Any,
    store: Store,
    execution_id: str,
    workflow_type: str,
    input: Any,
    now: datetime,
    decision_queue: str,
    id_reuse: str,
    admitting: Prepared | None = None,
) -> AppStart:
    """Write the start on ``connection`` (module docstring); ``TypeError`` for a kind it does not
    know, ``ValueError`` for one outside a transaction or on another kind of database.
    ``admitting``: its admission (``_store.admission``): a limited run is written waiting, and
    admitted by the claimant of its announcement or by the sweeper, never here."""
    admitting = admitting or Prepared(0)
    args = (execution_id, workflow_type, input, now, decision_queue)
    if isinstance(connection, scoped_session):
        connection = connection()
    if isinstance(connection, Session):
        _check_dialect(connection.get_bind().dialect.name, store)  # before it connects
        created = _on_sqlalchemy(connection.connection(), store, *args, id_reuse, admitting)
        return AppStart(created, partial(after_session_commit, connection))
    if isinstance(connection, Connection):
        return AppStart(_on_sqlalchemy(connection, store, *args, id_reuse, admitting), None)
    if _is_django(connection):
        if not connection.in_atomic_block:
            raise ValueError(
                "start_workflow(connection=<Django connection>) must be called inside "
                f"transaction.atomic(using={connection.alias!r}): outside one, Django "
                "commits every statement on its own"
            )
        _check_postgres(store, f"Django connection {connection.alias!r}", connection.vendor)
        connection.ensure_connection()
        created = _on_dbapi(connection.connection, store, *args, id_reuse, admitting)
        return AppStart(created, partial(connection.on_commit, robust=True))
    raw = getattr(connection, "driver_connection", connection)  # engine.raw_connection()
    if dbapi.is_dbapi_connection(raw):
        _check_postgres(store, type(raw).__module__, "postgresql")
        return AppStart(_on_dbapi(raw, store, *args, id_reuse, admitting), None)
    raise TypeError(
        "start_workflow(connection=...) takes a SQLAlchemy Connection or Session, a "
        "psycopg2 or psycopg 3 connection, or a Django connection; not "
        f"{type(connection).__module__}.{type(connection).__name__}"
    )


def _is_django(connection: Any) -> bool:
    return all(
        hasattr(connection, name)
        for name in ("in_atomic_block", "on_commit", "ensure_connection", "alias", "vendor")
    )


def _check_postgres(store: Store, what: str, vendor: str) -> None:
    if store.dialect.name != "postgresql" or vendor != "postgresql":
        raise ValueError(
            f"{what} is a {vendor} connection and the harvest database is "
            f"{store.dialect.name}: a start joins the application's transaction only "
            "when both are the same Postgres database"
        )


def _check_dialect(name: str, store: Store) -> None:
    if name != store.dialect.name:
        raise ValueError(
            f"the connection is on {name} and the harvest database is "
            f"{store.dialect.name}: a start joins the application's transaction only "
            "on the harvest database"
        )


def _on_sqlalchemy(
    conn: Connection,
    store: Store,
    execution_id: str,
    workflow_type: str,
    input: Any,
    now: datetime,
    decision_queue: str,
    id_reuse: str,
    admitting: Prepared,
) -> bool:
    _check_dialect(conn.dialect.name, store)
    if conn._is_autocommit_isolation():
        raise ValueError(
            "start_workflow(connection=...) needs a connection inside a transaction, "
            "not one in AUTOCOMMIT isolation"
        )
    tx = Tx(conn, store.dialect, payloads_on(store, conn))
    return starts.start(
        tx,
        execution_id,
        workflow_type,
        input,
        now,
        decision_queue,
        id_reuse=id_reuse,
        announce=True,
        admission=admitting.columns(store.dialect, tx.payloads, execution_id),
    )


def _on_dbapi(
    raw: Any,
    store: Store,
    execution_id: str,
    workflow_type: str,
    input: Any,
    now: datetime,
    decision_queue: str,
    id_reuse: str,
    admitting: Prepared,
) -> bool:
    if not dbapi.in_transaction(raw):
        raise ValueError(
            "start_workflow(connection=...) needs a connection inside a transaction: "
            "this one is in autocommit mode (open one first, e.g. psycopg 3's "
            "conn.transaction(), or set autocommit off)"
        )
    return dbapi.start(
        raw,
        store.payloads,
        _blobs_here(store),
        execution_id,
        workflow_type,
        input,
        now,
        decision_queue,
        id_reuse,
        admitting=admitting,
    )


def _blobs_here(store: Store) -> bool:
    blobs = store.payloads.store
    return isinstance(blobs, PostgresPayloadStore) and blobs.lives_in(store.database_url)


def payloads_on(store: Store, conn: Connection) -> Payloads:
    """The store's payload pipeline with its blob writes made on ``conn`` when its payload store
    is the Postgres one in the harvest database (any other store writes outside the transaction:
    a rollback may leave an unreferenced blob there, never a reference without its blob)."""
    blobs = store.payloads.store
    if _blobs_here(store):
        assert isinstance(blobs, PostgresPayloadStore)
        return store.payloads.with_store(blobs.on_connection(conn))
    return store.payloads


# ── a Session's after-commit hook ────────────────────────────────────────────────────────────
def after_session_commit(session: Session | scoped_session[Any], fn: Callable[[], None]) -> None:
    """Run ``fn`` after the session's transaction commits; drop it if that transaction ends
    otherwise (rolled back, closed). One pair of listeners per session, whatever the starts."""
    if isinstance(session, scoped_session):
        session = session()
    pending = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        event.listen(session, "after_commit", _run_pending)
        event.listen(session, "after_transaction_end", _drop_pending)
    pending.append(fn)


def _run_pending(session: Session) -> None:
    pending = session.info.get(_PENDING) or []
    callbacks = list(pending)
    pending.clear()
    for fn in callbacks:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the commit happened; the sweeper re-requests it
            log.exception(
                "harvest: an after-commit dispatch failed; the run's decision is "
                "requested by a decision worker or the sweeper instead"
            )


def _drop_pending(session: Session, transaction: Any) -> None:
    if transaction.parent is None:  # the root transaction ended: what it did not commit is gone
        pending = session.info.get(_PENDING)
        if pending:
            pending.clear()
