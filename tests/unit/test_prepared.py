"""The hot path's prepared statements (``_store.prepared``), without a database: a text's
``PREPARE`` body, what is sent on a connection that may prepare and on one that may not, and
the per-connection cache (a text not preparable is sent as it is; the least recently used
statement is deallocated)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery._store import prepared


def test_a_pyformat_text_becomes_a_prepare_body_with_numbered_parameters():
    body, order = prepared.body("SELECT %(a)s, %(b)s WHERE x = %(a)s AND y LIKE 'p%%'")
    assert body == "SELECT $1, $2 WHERE x = $1 AND y LIKE 'p%'"
    assert order == ("a", "b")
    assert prepared.body("SELECT 1") == ("SELECT 1", ())


class Cursor:
    def __init__(self, server: Server) -> None:
        self.server = server

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def execute(self, text: str) -> None:
        self.server.raw.append(text)
        if text.startswith("PREPARE") and "unpreparable" in text:
            raise ValueError("inconsistent types deduced for parameter $1")


class Server:
    """A connection as ``prepared`` sees it: its record's info, its DB-API connection (raw
    ``PREPARE``/``DEALLOCATE`` texts) and ``exec_driver_sql`` (what a statement sends)."""

    def __init__(self, *, on: bool = True, autocommit: bool = True, fail: str | None = None) -> None:
        self.raw: list[str] = []
        self.sent: list[str] = []
        self.fail = fail
        dbapi = SimpleNamespace(autocommit=autocommit, cursor=lambda: Cursor(self))
        self.connection = SimpleNamespace(
            info={"harvest_prepare": True} if on else {}, dbapi_connection=dbapi
        )

    def exec_driver_sql(self, text: str, params: dict[str, Any]) -> str:
        self.sent.append(text)
        if self.fail and text.startswith("EXECUTE"):
            code, self.fail = self.fail, None
            raise sa.exc.DBAPIError(text, params, SimpleNamespace(pgcode=code))  # type: ignore[arg-type]
        return text


def run(server: Server, *texts: str) -> Any:
    return prepared.execute(server, list(texts), {"a": 1})  # type: ignore[arg-type]


def test_each_text_of_a_trip_is_prepared_on_its_second_use_and_then_executed_by_name():
    server = Server()
    run(server, "SELECT %(a)s", "SELECT 2")  # seen once: a one-off text costs no PREPARE
    assert server.raw == [] and server.sent == ["SELECT %(a)s;\nSELECT 2"]
    run(server, "SELECT %(a)s", "SELECT 2")
    run(server, "SELECT %(a)s", "SELECT 2")
    assert [t.split()[0] for t in server.raw] == ["PREPARE", "PREPARE"]  # once each
    assert server.raw[0].endswith("AS SELECT $1") and server.raw[1].endswith("AS SELECT 2")
    first, second = server.raw[0].split()[1], server.raw[1].split()[1]
    assert server.sent[1:] == [f"EXECUTE {first}(%(a)s);\nEXECUTE {second}"] * 2  # one query


@pytest.mark.parametrize(
    "server", [Server(on=False), Server(autocommit=False)], ids=["not ours", "in a transaction"]
)
def test_an_application_connection_or_a_transaction_sends_the_text_as_it_is(server):
    run(server, "SELECT %(a)s", "SELECT 2")
    assert server.raw == []  # nothing prepared: a failed PREPARE would abort a transaction
    assert server.sent == ["SELECT %(a)s;\nSELECT 2"]


def test_a_text_postgres_cannot_prepare_is_sent_as_it_is_and_not_prepared_again():
    server = Server()
    for _ in range(3):
        run(server, "SELECT %(a)s -- unpreparable")
    assert len(server.raw) == 1  # one PREPARE tried
    assert server.sent == ["SELECT %(a)s -- unpreparable"] * 3


def test_an_execute_refused_before_anything_ran_forgets_the_statements_and_sends_the_text():
    server = Server(fail="26000")  # the prepared statement is gone
    run(server, "SELECT %(a)s")
    assert run(server, "SELECT %(a)s") == "SELECT %(a)s"  # EXECUTE refused, the text sent
    assert server.sent[-2].startswith("EXECUTE") and server.raw[-1] == "DEALLOCATE ALL"
    assert "harvest_prepared" not in server.connection.info
    run(server, "SELECT %(a)s")
    run(server, "SELECT %(a)s")  # prepared again
    assert server.raw[-1].startswith("PREPARE") and server.sent[-1].startswith("EXECUTE")


def test_any_other_execute_error_forgets_the_statements_and_reaches_the_caller():
    server = Server(fail="08006")  # a lost connection: the outcome may be unknown, never resent
    run(server, "SELECT %(a)s")
    with pytest.raises(sa.exc.DBAPIError):
        run(server, "SELECT %(a)s")
    assert server.sent[-1].startswith("EXECUTE") and len(server.sent) == 2
    assert "harvest_prepared" not in server.connection.info


def test_the_least_recently_used_statement_is_deallocated_past_the_cache_size(monkeypatch):
    monkeypatch.setattr(prepared, "SIZE", 2)
    server = Server()
    for n in (1, 1, 2, 2, 1, 3):  # each prepared on its second use; 2 is the least recent
        run(server, f"SELECT {n}")
    names = {t.split(" AS ")[1]: t.split()[1] for t in server.raw if t.startswith("PREPARE")}
    assert server.raw[-1] == f"DEALLOCATE {names['SELECT 2']}"
    assert list(server.connection.info["harvest_prepared"]) == ["SELECT 1", "SELECT 3"]
