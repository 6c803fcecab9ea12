"""Queries end to end on the embedded SQLite app (one process; the real-service tests are
tests/integration/test_queries.py): ``Harvest.query``, ``AsyncHarvest.query``, ``POST
/workflows/{id}/queries/{name}`` and ``harvest query`` answer a run waiting on a signal and write
nothing; refusals (a ctx command, an unknown name, an argument that is not JSON, an erased run,
a workflow this process does not register) each get their own error and write nothing either."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harvest_celery import (
    AsyncHarvest,
    ExecutionNotFound,
    Harvest,
    InvalidState,
    PayloadNotSerializable,
    QueryFailed,
    UnknownQuery,
    UnknownWorkflow,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._cli import main
from harvest_celery._store.schema import metadata
from harvest_celery._web.api import create_app


@activity
def qe_step(x: Any) -> str:
    return f"did {x}"


@workflow
async def qe_parked(ctx: WorkflowContext, data: Any) -> dict:
    state: dict[str, Any] = {"stage": "started", "peeked": 0}

    def peek(_arg: Any) -> int:
        state["peeked"] += 1
        return int(state["peeked"])

    ctx.set_query_handler("stage", lambda _arg: dict(state))
    ctx.set_query_handler("peek", peek)
    ctx.set_query_handler("echo", lambda arg: {"arg": arg})
    ctx.set_query_handler("schedules", lambda _arg: ctx.execute_activity(qe_step, "x"))
    ctx.set_query_handler("sleeps", lambda _arg: ctx.sleep(60))
    ctx.set_query_handler("raises", lambda _arg: 1 / 0)
    first = await ctx.execute_activity(qe_step, data)
    state["stage"] = f"waiting ({first})"
    approval = await ctx.wait_signal("approve")
    state["stage"] = f"approved by {approval}"
    return {**state, "second": await ctx.execute_activity(qe_step, state["peeked"])}


@workflow
async def qe_looping(ctx: WorkflowContext, n: int) -> int:
    ctx.set_query_handler("n", lambda _arg: n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return int(await ctx.wait_signal("stop"))


@pytest.fixture
def harvest(tmp_path, monkeypatch) -> Harvest:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = Harvest(f"sqlite:///{tmp_path / 'queries.db'}")
    h.migrate()
    return h.register(qe_parked, qe_step, qe_looping)


def database(h: Harvest) -> dict[str, list[Any]]:
    """Every row of every table: what a query must leave exactly as it found it."""
    with h.store.engine.connect() as conn:
        return {t.name: [tuple(r) for r in conn.execute(sa.select(t))] for t in metadata.sorted_tables}


def parked(h: Harvest, run_id: str = "qe-1") -> str:
    h.start_workflow("qe_parked", "a", execution_id=run_id)  # embedded: drained to its signal
    assert h.describe(run_id).status == "RUNNING"
    return run_id


def test_a_run_waiting_on_a_signal_answers_and_nothing_is_written(harvest):
    run_id = parked(harvest)
    before = database(harvest)
    assert harvest.query(run_id, "stage") == {"stage": "waiting (did a)", "peeked": 0}
    assert [harvest.query(run_id, "peek") for _ in range(3)] == [1, 1, 1]
    assert harvest.query(run_id, "echo", [1, 2]) == {"arg": [1, 2]}
    assert database(harvest) == before
    harvest.signal(run_id, "approve", "ops")
    # the next decision saw no handler's change: peeked is 0, and so was the step's input
    assert harvest.result(run_id) == {"stage": "approved by ops", "peeked": 0, "second": "did 0"}
    assert harvest.query(run_id, "stage") == {"stage": "approved by ops", "peeked": 0}  # closed


def test_a_warm_replay_is_never_touched(harvest):
    run_id = parked(harvest)
    sessions = harvest.runtime.sessions
    warm = sessions.take(run_id)
    assert warm is not None  # the run is warm: its next decision would reuse this replay
    sessions.put(run_id, warm)
    assert [harvest.query(run_id, "peek") for _ in range(3)] == [1, 1, 1]
    kept = sessions.take(run_id)
    assert kept is warm  # the same object, still cached: a query builds and drops its own
    sessions.put(run_id, kept)
    harvest.signal(run_id, "approve", "ops")
    assert harvest.result(run_id)["peeked"] == 0


@pytest.mark.parametrize("name, command", [("schedules", "ctx.execute_activity"), ("sleeps", "ctx.sleep")])
def test_a_handler_issuing_a_command_fails_and_writes_nothing(harvest, name, command):
    run_id = parked(harvest)
    before = database(harvest)
    with pytest.raises(QueryFailed) as failed:
        harvest.query(run_id, name)
    assert (failed.value.error_type, failed.value.command) == ("QueryCommand", command)
    assert database(harvest) == before


def test_refusals_each_get_their_error_and_write_nothing(harvest):
    run_id = parked(harvest)
    before = database(harvest)
    with pytest.raises(UnknownQuery) as unknown:
        harvest.query(run_id, "nope")
    assert unknown.value.known == ["echo", "peek", "raises", "schedules", "sleeps", "stage"]
    with pytest.raises(PayloadNotSerializable):
        harvest.query(run_id, "echo", float("nan"))
    with pytest.raises(PayloadNotSerializable):
        harvest.query(run_id, "echo", {"k": object()})
    with pytest.raises(QueryFailed) as failed:
        harvest.query(run_id, "raises")
    assert failed.value.error_type == "ZeroDivisionError"
    with pytest.raises(ExecutionNotFound):
        harvest.query("no-such-run", "stage")
    assert database(harvest) == before


def test_a_process_that_does_not_register_the_workflow_cannot_answer(harvest):
    run_id = parked(harvest)
    stranger = Harvest(harvest.database_url)  # the same database, none of its workflows
    with pytest.raises(UnknownWorkflow):
        stranger.query(run_id, "stage")


def test_an_id_of_a_chain_is_answered_by_its_current_run(harvest):
    first = harvest.start_workflow("qe_looping", 0, execution_id="loop")
    assert harvest.describe(first).status == "CONTINUED_AS_NEW"
    current = harvest.describe(harvest.describe(first).continued_to or "").continued_to
    assert current is not None and harvest.describe(current).status == "RUNNING"
    assert harvest.query(first, "n") == harvest.query(current, "n") == 2
    with pytest.raises(UnknownQuery) as unknown:
        harvest.query(first, "nope")
    assert unknown.value.execution_id == current


def test_a_paused_run_answers(harvest):
    run_id = parked(harvest)
    harvest.pause(run_id)
    before = database(harvest)
    assert harvest.query(run_id, "stage")["stage"] == "waiting (did a)"
    assert database(harvest) == before


def test_an_erased_run_is_refused(harvest):
    run_id = parked(harvest)
    harvest.signal(run_id, "approve", "ops")
    harvest.result(run_id)
    harvest.erase_payloads(run_id)
    before = database(harvest)
    with pytest.raises(InvalidState) as refused:
        harvest.query(run_id, "stage")
    assert (refused.value.status, refused.value.operation) == ("erased", "query")
    assert database(harvest) == before


def test_async_harvest_query(harvest):
    run_id = parked(harvest)

    async def ask() -> list[Any]:
        async with AsyncHarvest(harvest) as ah:
            answers = [await ah.query(run_id, "stage")]
            with pytest.raises(UnknownQuery):
                await ah.query(run_id, "nope")
            return answers

    assert asyncio.run(ask()) == [{"stage": "waiting (did a)", "peeked": 0}]


def test_the_http_endpoint(harvest):
    run_id = parked(harvest)
    client = TestClient(create_app(harvest))
    before = database(harvest)
    resp = client.post(f"/workflows/{run_id}/queries/echo", json={"arg": {"n": 1}})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "query": "echo", "result": {"arg": {"n": 1}}}
    assert client.post(f"/workflows/{run_id}/queries/stage").json()["result"]["stage"] == "waiting (did a)"
    refusals = [
        (client.post(f"/workflows/{run_id}/queries/nope"), 404, "UnknownQuery"),
        (client.post(f"/workflows/{run_id}/queries/schedules"), 400, "QueryFailed"),
        (client.post(f"/workflows/{run_id}/queries/raises"), 400, "QueryFailed"),
        (client.post("/workflows/ghost/queries/stage"), 404, "ExecutionNotFound"),
        (
            client.post(
                f"/workflows/{run_id}/queries/echo",
                content=b'{"arg": NaN}',
                headers={"content-type": "application/json"},
            ),
            422,
            "PayloadNotSerializable",
        ),
        (client.post(f"/workflows/{run_id}/queries/echo", json={"arg": 1, "x": 2}), 422, "ValidationError"),
        (client.post(f"/workflows/{run_id}/queries/%20"), 400, "ValueError"),
    ]
    for resp, status, error in refusals:
        assert (resp.status_code, resp.json()["error"]) == (status, error), resp.text
    assert database(harvest) == before
    harvest.signal(run_id, "approve", "ops")
    harvest.result(run_id)
    harvest.erase_payloads(run_id)
    resp = client.post(f"/workflows/{run_id}/queries/stage")
    assert (resp.status_code, resp.json()["error"]) == (409, "InvalidState")
    operation = client.get("/openapi.json").json()["paths"]["/workflows/{execution_id}/queries/{name}"]
    assert set(operation) == {"post"}
    assert {"200", "400", "404", "409", "422"} <= set(operation["post"]["responses"])


def test_the_cli(tmp_path, monkeypatch, capsys):
    for name in list(os.environ):
        if name.startswith("HARVEST_"):
            monkeypatch.delenv(name)
    db = tmp_path / "cli.db"
    monkeypatch.setenv("HARVEST_QUERY_TEST_DB", str(db))
    monkeypatch.delitem(sys.modules, APP, raising=False)
    assert main(["--database-url", f"sqlite:///{db}", "db", "upgrade"]) == 0
    assert main(["--app", APP, "start", "qe_parked", '"a"', "--id", "cli-1"]) == 0
    capsys.readouterr()
    assert main(["--app", APP, "query", "cli-1", "echo", '{"n": [1]}']) == 0
    assert json.loads(capsys.readouterr().out) == {"arg": {"n": [1]}}
    assert main(["--app", APP, "query", "cli-1", "stage"]) == 0
    assert json.loads(capsys.readouterr().out) == {"stage": "waiting (did a)", "peeked": 0}
    assert main(["--app", APP, "query", "cli-1", "nope"]) == 2
    assert "UnknownQuery" not in (err := capsys.readouterr().err) and "no query handler 'nope'" in err
    assert main(["--app", APP, "query", "cli-1", "echo", "[1,"]) == 2
    assert "ARG_JSON is not valid JSON" in capsys.readouterr().err


APP = "tests.unit.cli_query_app"
