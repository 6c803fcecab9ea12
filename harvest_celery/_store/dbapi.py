"""A start written with plain DB-API cursors on an application's own Postgres connection
(psycopg2, psycopg 3, or the one inside Django's connection), inside its transaction.

Why not wrap that connection in a SQLAlchemy engine (``create_engine(creator=…)``): SQLAlchemy
would run its dialect set-up on the application's connection — queries inside its transaction,
and (psycopg2) JSON type casters registered on it, which would change what Django's JSONField
reads — and its pool would reset (roll back) or close the connection on check-in. A start needs
three statements, so they are written here once, in SQL both drivers accept (``%(name)s``
parameters, JSON passed as text and cast), reading back only text columns (an application may
have changed how its connection decodes JSON or timestamps).

The statements (``sql.START``, ``sql.EXISTING``, ``sql.BLOB``; ``starts`` holds the rules they
follow):

1. one statement inserts the run row (``ON CONFLICT (id) DO NOTHING``), its ``WorkflowStarted``
   only if the row was new, and the announcement (``pg_notify``, delivered on commit);
2. if the id existed: the existing run's workflow, status and input digest, to judge the reuse;
3. if the row was new and a payload was offloaded: the blobs, on the same connection when the
   Postgres payload store lives in the harvest database (a rollback leaves none behind).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.lifecycle import RUNNING
from harvest_celery._errors import ExecutionAlreadyExists
from harvest_celery._payloads.digest import input_digest
from harvest_celery._payloads.pipeline import Payloads
from harvest_celery._payloads.stores import DeferredPuts
from harvest_celery._store import sql
from harvest_celery._store.admission import Prepared
from harvest_celery._store.starts import check_policy, check_reuse, legacy_digest_of, start_notice


def is_dbapi_connection(conn: Any) -> bool:
    """A psycopg2 or psycopg 3 (sync) connection."""
    package = type(conn).__module__.split(".")[0]
    return (
        package in ("psycopg2", "psycopg")
        and callable(getattr(conn, "cursor", None))
        and not type(conn).__name__.startswith("Async")
    )


def in_transaction(conn: Any) -> bool:
    """Whether statements on ``conn`` run inside one transaction the application will commit or
    roll back: not in autocommit mode (the driver begins one), or in autocommit mode inside an
    explicit ``BEGIN`` (psycopg 3's ``conn.transaction()``)."""
    if not getattr(conn, "autocommit", False):
        return True
    info = getattr(conn, "info", None)  # psycopg 3
    if info is not None and hasattr(info, "transaction_status"):
        return int(info.transaction_status) != 0  # 0: IDLE
    status = getattr(conn, "get_transaction_status", None)  # psycopg2
    return status is not None and int(status()) != 0


def _one(conn: Any, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """One statement on the application's connection. On psycopg 3 it is never prepared on the
    server, whatever the connection's ``prepare_threshold``: behind a transaction pooler
    (PgBouncer before 1.21) a prepared statement would be looked for in another session."""
    cursor = conn.cursor()
    try:
        if type(conn).__module__.split(".")[0] == "psycopg":
            cursor.execute(sql, params, prepare=False)
        else:
            cursor.execute(sql, params)
        row = cursor.fetchone() if cursor.description is not None else None
        return tuple(row) if row is not None else None
    finally:
        cursor.close()


def start(
    conn: Any,
    payloads: Payloads,
    blobs_here: bool,
    execution_id: str,
    workflow_type: str,
    input: Any,
    now: datetime,
    decision_queue: str,
    id_reuse: str = "idempotent",
    *,
    again: bool = True,
    admitting: Prepared | None = None,
) -> bool:
    """Write a start on ``conn`` (module docstring). True: a new run; False: the id exists and
    ``id_reuse`` accepts it. ``blobs_here``: offloaded blobs are written on ``conn`` (the Postgres
    payload store of the harvest database); otherwise through the store, once the row is new."""
    check_policy(id_reuse)
    digest = input_digest(execution_id, input)
    deferred = DeferredPuts(payloads.store) if payloads.store is not None else None
    recording = payloads.with_store(deferred) if deferred is not None else payloads
    encoded = recording.encode_value(input, f"{execution_id}/input")
    level = admitting.priority if admitting is not None else 0
    started = ev.WorkflowStarted(workflow_type, input, priority=level)
    event = recording.encode_event(started.to_data(), f"{execution_id}/0")
    params = _start_params(execution_id, workflow_type, encoded, event, digest, now, decision_queue)
    statement = _admission(params, admitting, recording, execution_id)
    if _one(conn, statement, params) is None:
        found = _one(conn, sql.EXISTING, {"id": execution_id})
        if found is None and again:  # purged in between: a new start of the id
            return start(
                conn,
                payloads,
                blobs_here,
                execution_id,
                workflow_type,
                input,
                now,
                decision_queue,
                id_reuse,
                again=False,
                admitting=admitting,
            )
        if found is None:
            raise ExecutionAlreadyExists(execution_id, "?", "exists")
        check_reuse(
            execution_id,
            found[0],
            found[1],
            found[2],
            workflow_type,
            digest,
            id_reuse,
            lambda: _legacy_digest(conn, payloads, execution_id),
        )
        return False
    if deferred is not None:
        _put_blobs(conn, deferred, blobs_here)
    return True


def _admission(params: dict[str, Any], admitting: Prepared | None, payloads: Payloads, run_id: str) -> str:
    """The start statement for its admission (``_store.admission``), its parameters added: a
    limited run is written waiting (no decision request); a priority other than 0 is stored."""
    if admitting is None or not (admitting.limited or admitting.priority):
        return sql.START
    key = admitting.encoded_key(payloads, run_id) if admitting.limited else None
    params.update(priority=admitting.priority, limit_key=json.dumps(key), limit_digest=admitting.digest)
    return sql.START_WAITING if admitting.limited else sql.START_PRIORITY


def _start_params(
    execution_id: str,
    workflow_type: str,
    encoded: Any,
    event: Any,
    digest: str,
    now: datetime,
    decision_queue: str,
) -> dict[str, Any]:
    return {
        "id": execution_id,
        "workflow_type": workflow_type,
        "status": RUNNING,
        "input": json.dumps(encoded),
        "digest": digest,
        "now": now,
        "event_type": ev.WorkflowStarted.type,
        "event": json.dumps(event),
        "notice": start_notice(execution_id, now, decision_queue),
        "decision_queue": decision_queue,
    }


def _put_blobs(conn: Any, deferred: DeferredPuts, blobs_here: bool) -> None:
    """A new run's offloaded blobs: on ``conn`` (a rollback leaves none behind), or through the
    store, outside the transaction (docs/payloads.md)."""
    for key, data in deferred.puts:
        if blobs_here:
            _one(conn, sql.BLOB, {"key": key, "store_id": deferred.store_id, "data": data})
        else:
            deferred.store.put(key, data)


def _legacy_digest(conn: Any, payloads: Payloads, execution_id: str) -> str | None:
    row = _one(conn, sql.INPUT, {"id": execution_id})
    stored = json.loads(row[0]) if row is not None and row[0] is not None else None
    return legacy_digest_of(execution_id, stored, payloads.decode_value)
