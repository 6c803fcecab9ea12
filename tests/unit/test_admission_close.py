"""A limited workflow's close in one trip (``admission.close_in_one_trip``), its pure parts: which
driver may take it, which writes the one-statement path still refuses, the statements' keying on
the run this transaction closed, and what the trip's last result stages. On real Postgres:
tests/integration/test_admission_close.py."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from harvest_celery._store import admission, sql
from harvest_celery._store.dialect import Dialect, SqliteDialect
from harvest_celery._store.records import RunRow
from harvest_celery._store.staging import RunWrite
from harvest_celery._store.staging import one_statement_refusal as _not_one_statement

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
REGISTRY: Any = SimpleNamespace(
    workflows={
        "limited": SimpleNamespace(admission=SimpleNamespace(limited=True)),
        "free": SimpleNamespace(admission=SimpleNamespace(limited=False)),
    }
)


def test_only_a_trip_sent_as_one_simple_query_commits_together():
    assert Dialect().trip_commits_together("psycopg2")
    assert not Dialect().trip_commits_together("psycopg")  # psycopg 3: one by one
    assert not SqliteDialect().trip_commits_together("pysqlite")


def closing(workflow: str, **values: Any) -> tuple[RunWrite, RunRow]:
    w = RunWrite("r1", values={"status": "COMPLETED", **values}, abandon=(NOW, "closed"))
    return w, RunRow.assumed("r1", workflow, 5, None)


def test_a_limited_close_is_refused_only_when_its_trip_cannot_commit_together():
    w, row = closing("limited")
    assert _not_one_statement(w, row, REGISTRY, together=False) == "admission"
    assert _not_one_statement(w, row, REGISTRY, together=True) == ""
    w, row = closing("free")
    assert _not_one_statement(w, row, REGISTRY, together=False) == ""
    step = RunWrite("r1", values={"next_seq": 9})  # a step that does not close: never refused
    assert _not_one_statement(step, RunRow.assumed("r1", "limited", 5, None), REGISTRY, together=False) == ""


def test_the_close_steps_take_the_settles_order_keyed_on_the_run_this_transaction_wrote():
    ensure, lock, settle = sql.ADMISSION_CLOSE_STEPS
    assert ensure.startswith("INSERT INTO harvest_limits") and "IS NOT NULL AND NOT EXISTS" in ensure
    assert "FOR UPDATE" in lock and "SKIP LOCKED" not in lock  # the limit row, after the run row
    assert "FOR UPDATE SKIP LOCKED" in settle  # then the waiting runs' rows
    for text in sql.ADMISSION_CLOSE_STEPS:
        # never a key given by the caller: the closing run's own, read only once written here
        assert "%(name)s" not in text and "%(digest)s" not in text
        assert "xmin = pg_current_xact_id_if_assigned()::xid" in text
    last = settle.rsplit("\n)\n", 1)[1]
    for column in ("AS name", "AS digest", "AS deferred", "adm.id", "adm.decision_queue"):
        assert column in last
    # the ordinary settle defers nothing (its transaction releases held rows itself)
    assert "SELECT false AS d" in sql.SETTLE_ADMISSION and "xmin" not in sql.SETTLE_ADMISSION


class FakeTx:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows
        self.sent: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.decided: list[tuple[str, str]] = []
        self.unsettled: set[tuple[str, str]] = set()
        self.conn = object()
        self.dialect = SimpleNamespace(in_one_trip=self.in_one_trip)

    def in_one_trip(self, conn: Any, texts: Any, params: dict[str, Any]) -> Any:
        self.sent.append((tuple(texts), params))
        return SimpleNamespace(all=lambda: self.rows)

    def decide_admitted(self, execution_id: str, queue: str, now: datetime) -> None:
        self.decided.append((execution_id, queue))


def row(id: str | None, queue: str | None = None, deferred: bool = False) -> Any:
    return SimpleNamespace(name="limited", digest="d1", deferred=deferred, id=id, decision_queue=queue)


def test_a_refused_trip_stages_nothing():
    tx = FakeTx([])
    assert admission.close_in_one_trip(tx, ("UPDATE …", {"run_id": "r1"}), NOW) is False  # type: ignore[arg-type]
    assert tx.decided == [] and tx.unsettled == set()
    texts, params = tx.sent[0]
    assert texts == ("UPDATE …", *sql.ADMISSION_CLOSE_STEPS)  # the write first, in one trip
    assert params == {"run_id": "r1", "now": NOW}


def test_a_written_trip_requests_the_admitted_runs_decisions_or_leaves_a_deferred_settle():
    tx = FakeTx([row("a", "q1"), row("b")])
    assert admission.close_in_one_trip(tx, ("UPDATE …", {}), NOW) is True  # type: ignore[arg-type]
    assert tx.decided == [("a", "q1"), ("b", "harvest")] and tx.unsettled == set()
    tx = FakeTx([row(None)])  # written, nobody admitted
    assert admission.close_in_one_trip(tx, ("UPDATE …", {}), NOW) is True  # type: ignore[arg-type]
    assert tx.decided == [] and tx.unsettled == set()
    tx = FakeTx([row(None, deferred=True)])  # a run it would admit has held rows
    assert admission.close_in_one_trip(tx, ("UPDATE …", {}), NOW) is True  # type: ignore[arg-type]
    assert tx.decided == [] and tx.unsettled == {("limited", "d1")}
