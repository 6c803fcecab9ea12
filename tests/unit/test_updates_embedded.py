"""Updates end to end on the embedded SQLite app (one process; the real-service tests are
tests/integration/test_updates.py): ``Harvest.update``, ``AsyncHarvest.update`` and ``POST
/workflows/{id}/updates/{name}`` validate, accept and return the handler's value; a rejection,
an unknown name, an argument that is not JSON and a run in the wrong state each get their own
error and write nothing; an update id is idempotent."""

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
    UnknownUpdate,
    UnknownWorkflow,
    UpdateFailed,
    UpdateRejected,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._cli import main
from harvest_celery._store.schema import executions, metadata
from harvest_celery._web.api import create_app


@activity
def ue_double(x: Any) -> int:
    return 2 * int(x)


@workflow
async def ue_counter(ctx: WorkflowContext, _data: Any) -> dict:
    state = {"total": 0}

    def positive(arg: Any) -> None:
        if not isinstance(arg, int) or arg <= 0:
            raise ValueError(f"not a positive int: {arg!r}")

    async def add(arg: int) -> int:
        state["total"] += await ctx.execute_activity(ue_double, arg)
        return state["total"]

    def fails(_arg: Any) -> None:
        raise RuntimeError("handler broke")

    async def forever(_arg: Any) -> None:
        await ctx.wait_signal("never")

    ctx.set_update_handler("add", add, validator=positive)
    ctx.set_update_handler("fails", fails)
    ctx.set_update_handler("forever", forever)
    ctx.set_query_handler("total", lambda _arg: state["total"])
    await ctx.wait_signal("stop")
    return state


@pytest.fixture
def harvest(tmp_path, monkeypatch) -> Harvest:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = Harvest(f"sqlite:///{tmp_path / 'updates.db'}")
    h.migrate()
    return h.register(ue_counter, ue_double)


def database(h: Harvest) -> dict[str, list[Any]]:
    """Every row of every table: what a refused update must leave exactly as it found it."""
    with h.store.engine.connect() as conn:
        return {t.name: [tuple(r) for r in conn.execute(sa.select(t))] for t in metadata.sorted_tables}


def updates_rows(h: Harvest) -> list[tuple[Any, ...]]:
    with h.store.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text("SELECT execution_id, update_id, name FROM harvest_workflow_updates")
            )
        ]


def types(h: Harvest, run_id: str) -> list[str]:
    return [e.event.type for e in h.store.history(run_id)]


def waiting(h: Harvest, run_id: str = "ue-1") -> str:
    h.start_workflow("ue_counter", None, execution_id=run_id)  # embedded: drained to its signal
    assert h.describe(run_id).status == "RUNNING"
    return run_id


def test_an_accepted_update_whose_handler_awaits_an_activity_returns_its_value(harvest):
    run_id = waiting(harvest)
    assert harvest.update(run_id, "add", 5, update_id="u1") == 10
    assert harvest.update(run_id, "add", 1) == 12
    assert harvest.query(run_id, "total") == 12
    assert updates_rows(harvest)[0] == (run_id, "u1", "add")
    assert (
        types(harvest, run_id).count("UpdateAccepted") == types(harvest, run_id).count("UpdateCompleted") == 2
    )
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id) == {"total": 12}


def test_an_update_id_already_accepted_runs_nothing_and_returns_the_same_value(harvest):
    run_id = waiting(harvest)
    assert harvest.update(run_id, "add", 5, update_id="u1") == 10
    before = database(harvest)
    assert harvest.update(run_id, "add", 5, update_id="u1") == 10
    assert harvest.update(run_id, "add", 7, update_id="u1") == 10  # the id decides, not the argument
    assert database(harvest) == before


def test_a_rejected_update_writes_nothing(harvest):
    run_id = waiting(harvest)
    before = database(harvest)
    with pytest.raises(UpdateRejected) as rejected:
        harvest.update(run_id, "add", -1)
    assert (rejected.value.error_type, rejected.value.name) == ("ValueError", "add")
    assert database(harvest) == before  # no event, no updates row, no decision request


def test_bad_input_gets_a_specific_error_and_writes_nothing(harvest):
    run_id = waiting(harvest)
    before = database(harvest)
    with pytest.raises(UnknownUpdate) as unknown:
        harvest.update(run_id, "nope", 1)
    assert unknown.value.known == ["add", "fails", "forever"]
    with pytest.raises(PayloadNotSerializable):
        harvest.update(run_id, "add", float("nan"))
    for timeout in (0, -1):
        with pytest.raises(ValueError, match="timeout"):
            harvest.update(run_id, "add", 1, timeout=timeout)
    with pytest.raises(ValueError, match="update id"):
        harvest.update(run_id, "add", 1, update_id="")
    with pytest.raises(ExecutionNotFound):
        harvest.update("ghost", "add", 1)
    with pytest.raises(UnknownWorkflow):
        Harvest(harvest.database_url).update(run_id, "add", 1)
    assert database(harvest) == before


def test_a_raising_handler_is_the_callers_update_failed(harvest):
    run_id = waiting(harvest)
    with pytest.raises(UpdateFailed) as failed:
        harvest.update(run_id, "fails", None, update_id="u1")
    assert (failed.value.error_type, failed.value.error_message) == ("RuntimeError", "handler broke")
    with pytest.raises(UpdateFailed):  # the same answer again
        harvest.update(run_id, "fails", None, update_id="u1")
    assert harvest.describe(run_id).status == "RUNNING"


def test_a_timeout_leaves_the_update_accepted_and_an_update_open_at_close_fails(harvest):
    run_id = waiting(harvest)
    with pytest.raises(TimeoutError, match="same update_id"):
        harvest.update(run_id, "forever", None, update_id="u1", timeout=0.2)
    assert types(harvest, run_id)[-1] == "UpdateAccepted"
    harvest.signal(run_id, "stop")
    assert harvest.result(run_id) == {"total": 0}
    with pytest.raises(UpdateFailed) as failed:
        harvest.update(run_id, "forever", None, update_id="u1")
    assert failed.value.error_type == "RunClosed" and "COMPLETED" in failed.value.error_message


@pytest.mark.parametrize("state", ["paused", "cancelled", "closed", "erased", "nd-blocked"])
def test_updates_on_runs_in_the_wrong_state_are_invalid_state_and_write_nothing(harvest, state):
    run_id = waiting(harvest)
    if state == "paused":
        harvest.pause(run_id)
    elif state == "nd-blocked":  # as a decision that diverged leaves it
        with harvest.store.engine.begin() as conn:
            conn.execute(
                sa.update(executions).where(executions.c.id == run_id).values(nd_blocked_at=sa.func.now())
            )
    elif state == "cancelled":
        harvest.cancel_workflow_execution(run_id, "stop")
    else:
        harvest.signal(run_id, "stop")
        harvest.result(run_id)
        if state == "erased":
            harvest.erase_payloads(run_id)
    before = database(harvest)
    with pytest.raises(InvalidState) as refused:
        harvest.update(run_id, "add", 1)
    assert refused.value.operation == "send an update to"
    expected = {"paused": "paused", "cancelled": "CANCELLED", "closed": "COMPLETED"}
    assert refused.value.status == expected.get(state, state)
    assert database(harvest) == before


def test_async_harvest_update(harvest):
    run_id = waiting(harvest)

    async def send() -> list[Any]:
        async with AsyncHarvest(harvest) as ah:
            values = [await ah.update(run_id, "add", 2, update_id="a1")]
            with pytest.raises(UpdateRejected):
                await ah.update(run_id, "add", 0)
            values.append(await ah.update(run_id, "add", 2, update_id="a1"))
            return values

    assert asyncio.run(send()) == [4, 4]


def test_the_http_endpoint(harvest):
    run_id = waiting(harvest)
    client = TestClient(create_app(harvest))
    resp = client.post(f"/workflows/{run_id}/updates/add", json={"arg": 3, "update_id": "h1"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "update": "add", "update_id": "h1", "result": 6}
    before = database(harvest)
    refusals = [
        (client.post(f"/workflows/{run_id}/updates/add", json={"arg": -1}), 400, "UpdateRejected"),
        (client.post(f"/workflows/{run_id}/updates/nope", json={"arg": 1}), 404, "UnknownUpdate"),
        (client.post("/workflows/ghost/updates/add", json={"arg": 1}), 404, "ExecutionNotFound"),
        (client.post(f"/workflows/{run_id}/updates/add", json={"arg": 1, "timeout": 0}), 400, "ValueError"),
        (
            client.post(
                f"/workflows/{run_id}/updates/add",
                content=b'{"arg": NaN}',
                headers={"content-type": "application/json"},
            ),
            422,
            "PayloadNotSerializable",
        ),
        (client.post(f"/workflows/{run_id}/updates/add", json={"arg": 1, "x": 2}), 422, "ValidationError"),
        (client.post(f"/workflows/{run_id}/updates/%20"), 400, "ValueError"),
    ]
    for resp, status, error in refusals:
        assert (resp.status_code, resp.json()["error"]) == (status, error), resp.text
    assert database(harvest) == before
    again = client.post(f"/workflows/{run_id}/updates/add", json={"arg": 3, "update_id": "h1"})
    assert again.json()["result"] == 6 and database(harvest) == before
    resp = client.post(f"/workflows/{run_id}/updates/forever", json={"timeout": 0.2, "update_id": "h2"})
    assert (resp.status_code, resp.json()["error"]) == (504, "UpdateTimeout")
    resp = client.post(f"/workflows/{run_id}/updates/fails")
    assert (resp.status_code, resp.json()["error"]) == (400, "UpdateFailed")
    harvest.pause(run_id)
    resp = client.post(f"/workflows/{run_id}/updates/add", json={"arg": 1})
    assert (resp.status_code, resp.json()["error"]) == (409, "InvalidState")
    operation = client.get("/openapi.json").json()["paths"]["/workflows/{execution_id}/updates/{name}"]
    assert set(operation) == {"post"}
    assert {"200", "400", "404", "409", "422", "504"} <= set(operation["post"]["responses"])


CLI_APP = "tests.unit.cli_update_app"


def test_the_cli(tmp_path, monkeypatch, capsys):
    for name in list(os.environ):
        if name.startswith("HARVEST_"):
            monkeypatch.delenv(name)
    db = tmp_path / "cli.db"
    monkeypatch.setenv("HARVEST_UPDATE_TEST_DB", str(db))
    monkeypatch.delitem(sys.modules, CLI_APP, raising=False)
    assert main(["--database-url", f"sqlite:///{db}", "db", "upgrade"]) == 0
    assert main(["--app", CLI_APP, "start", "ue_counter", "--id", "cli-u"]) == 0
    capsys.readouterr()
    assert main(["--app", CLI_APP, "update", "cli-u", "add", "3", "--update-id", "u1"]) == 0
    assert json.loads(capsys.readouterr().out) == 6
    assert main(["--app", CLI_APP, "update", "cli-u", "add", "3", "--update-id", "u1"]) == 0  # idempotent
    assert json.loads(capsys.readouterr().out) == 6
    assert main(["--app", CLI_APP, "update", "cli-u", "add", "-1"]) == 2  # the validator refuses
    assert "not a positive int" in capsys.readouterr().err
    assert main(["--app", CLI_APP, "update", "cli-u", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["--app", CLI_APP, "update", "cli-u", "add", "[1,"]) == 2
    assert "ARG_JSON is not valid JSON" in capsys.readouterr().err
