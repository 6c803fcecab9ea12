"""Starting a run, without services (embedded mode, SQLite): id validation, the id-reuse policies
and the input digest they compare (through encryption, offloading and erasure, and for runs made
before the digest), a start inside a SQLAlchemy session's or connection's transaction, the
deferred start, the claim of an announced start, and the async client."""

from __future__ import annotations

import asyncio
import json
import time
import typing
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from harvest_celery import (
    AsyncHarvest,
    ExecutionAlreadyExists,
    ExecutionNotFound,
    FernetCodec,
    FileSystemPayloadStore,
    Harvest,
    HarvestError,
    InvalidExecutionId,
    InvalidState,
    PayloadStoreError,
    RetryRefused,
    UnknownWorkflow,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._errors import error_body, http_status
from harvest_celery._payloads.digest import input_digest
from harvest_celery._store import dbapi, starts
from harvest_celery._store.schema import executions
from harvest_celery._web.api import create_app
from harvest_celery._web.models import IdReuse


@activity
def st_echo(data: Any) -> Any:
    return data


@workflow
async def st_flow(ctx: WorkflowContext, data: Any) -> Any:
    return await ctx.execute_activity(st_echo, data)


@workflow
async def st_other(ctx: WorkflowContext, data: Any) -> Any:
    return data


def make(tmp_path: Any, **kwargs: Any) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 'starts.db'}", **kwargs).register(st_flow, st_other, st_echo)
    h.migrate()
    return h


def run_ids(h: Harvest) -> list[str]:
    return sorted(r.id for r in h.list())


def started_events(h: Harvest, run_id: str) -> int:
    return sum(1 for e in h.history(run_id) if e.event.type == "WorkflowStarted")


# ── ids ─────────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize(
    "bad, why",
    [
        ("order:1", "':'"),
        ("a/b", "'/'"),
        ("line\nbreak", "control character"),
        ("bell\x07", "control character"),
        ("nul\x00", "control character"),
        ("   ", "empty"),
        ("x" * 201, "at most 200"),
        (42, "a string"),
    ],
)
def test_an_id_that_cannot_name_a_run_is_refused_and_writes_nothing(tmp_path, bad, why):
    h = make(tmp_path)
    with pytest.raises(InvalidExecutionId, match=why) as caught:
        h.start_workflow("st_flow", 1, bad)
    assert isinstance(caught.value, ValueError) and http_status(caught.value) == 400
    assert run_ids(h) == []
    with pytest.raises(InvalidExecutionId):
        h.start_workflow_on_commit("st_flow", 1, bad, session=Session())


def test_ids_with_dots_dashes_spaces_and_unicode_are_fine(tmp_path):
    h = make(tmp_path)
    for ok in ("order-42", "a.b_c", "with space", "café-ünïcode", "x" * 200):
        assert h.start_workflow("st_flow", 1, ok) == ok


# ── id reuse ────────────────────────────────────────────────────────────────────────────────
def test_the_same_start_again_is_the_same_run(tmp_path):
    h = make(tmp_path)
    assert h.start_workflow("st_flow", {"a": 1, "b": [1, 2]}, "r1") == "r1"
    assert h.start_workflow("st_flow", {"b": [1, 2], "a": 1}, "r1") == "r1"  # key order is no change
    assert started_events(h, "r1") == 1
    assert h.result("r1", timeout=5) == {"a": 1, "b": [1, 2]}
    assert h.start_workflow("st_flow", {"a": 1, "b": [1, 2]}, "r1") == "r1"  # completed: still it


def test_another_input_under_the_same_id_is_a_conflict_that_writes_nothing(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_flow", {"a": 1}, "r1")
    with pytest.raises(ExecutionAlreadyExists, match="different input") as caught:
        h.start_workflow("st_flow", {"a": 2}, "r1")
    err = caught.value
    assert (err.execution_id, err.workflow_type, err.conflict) == ("r1", "st_flow", "input")
    assert err.status == "COMPLETED"  # embedded mode ran it at once
    assert http_status(err) == 409 and error_body(err)["conflict"] == "input"
    assert started_events(h, "r1") == 1 and h.describe("r1").input == {"a": 1}


def test_an_id_of_another_workflow_is_a_conflict_under_every_policy(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_flow", 1, "r1")
    for policy in starts.ID_REUSE:
        with pytest.raises(ExecutionAlreadyExists, match="cannot start it as a 'st_other' run") as caught:
            h.start_workflow("st_other", 1, "r1", id_reuse=policy)
        assert caught.value.conflict == "workflow" and caught.value.requested == "st_other"


def test_use_existing_answers_whatever_the_input_and_reject_refuses_any_reuse(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_flow", 1, "r1")
    assert h.start_workflow("st_flow", 2, "r1", id_reuse="use_existing") == "r1"
    with pytest.raises(ExecutionAlreadyExists) as caught:
        h.start_workflow("st_flow", 1, "r1", id_reuse="reject")
    assert caught.value.conflict == "exists"
    assert h.start_workflow("st_flow", 1, "r2", id_reuse="reject") == "r2"  # a new id is fine
    with pytest.raises(ValueError, match="id_reuse must be one of"):
        h.start_workflow("st_flow", 1, "r3", id_reuse="sometimes")
    assert run_ids(h) == ["r1", "r2"]


@pytest.fixture
def api(tmp_path, monkeypatch) -> tuple[Harvest, TestClient]:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)
    h = make(tmp_path)
    return h, TestClient(create_app(h))


def test_post_workflows_takes_the_id_reuse_policy(api):
    h, client = api

    def start(input: Any, run_id: str, **extra: Any) -> Any:
        return client.post(
            "/workflows", json={"workflow": "st_flow", "input": input, "execution_id": run_id, **extra}
        )

    assert start(1, "r1").status_code == 201
    assert start(1, "r1").json() == {"execution_id": "r1"}  # the default: idempotent
    conflict = start(2, "r1")
    assert conflict.status_code == 409 and conflict.json()["conflict"] == "input"
    reused = start(2, "r1", id_reuse="use_existing")
    assert (reused.status_code, reused.json()) == (201, {"execution_id": "r1"})
    rejected = start(1, "r1", id_reuse="reject")
    assert rejected.status_code == 409 and rejected.json()["conflict"] == "exists"
    assert start(1, "r2", id_reuse="reject").status_code == 201  # a new id is fine
    assert started_events(h, "r1") == 1 and h.describe("r1").input == 1


@pytest.mark.parametrize("bad", ["sometimes", "", None, 1, ["reject"]])
def test_post_workflows_refuses_an_unknown_id_reuse_and_writes_nothing(api, bad):
    h, client = api
    resp = client.post(
        "/workflows", json={"workflow": "st_flow", "input": 1, "execution_id": "r1", "id_reuse": bad}
    )
    assert resp.status_code == 422 and resp.json()["error"] == "ValidationError"
    assert "id_reuse" in json.dumps(resp.json()["detail"])
    assert run_ids(h) == []


def test_the_api_offers_exactly_the_clients_id_reuse_policies(api):
    assert typing.get_args(IdReuse) == starts.ID_REUSE
    _, client = api
    schema = client.get("/openapi.json").json()["components"]["schemas"]["StartWorkflowRequest"]
    assert schema["properties"]["id_reuse"]["enum"] == list(starts.ID_REUSE)
    assert schema["properties"]["id_reuse"]["default"] == "idempotent"


def test_signal_with_start_signals_an_existing_run_whatever_its_input(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_other", {"v": 1}, "s1")
    h.result("s1", timeout=5)
    with pytest.raises(InvalidState):  # it exists (another input is fine) but is completed
        h.signal_with_start("st_other", {"v": 2}, "s1", "ping")
    with pytest.raises(ExecutionAlreadyExists):
        h.signal_with_start("st_flow", {"v": 2}, "s1", "ping")


def test_the_digest_survives_encryption_offloading_and_erasure(tmp_path):
    codec = FernetCodec({"k1": Fernet.generate_key()}, "k1")
    store = FileSystemPayloadStore(tmp_path / "blobs")
    h = make(tmp_path, codec=codec, payload_store=store, offload_threshold=64)
    big = {"card": "4111" * 40}
    h.start_workflow("st_flow", big, "e1")
    h.result("e1", timeout=5)
    h.erase_payloads("e1")
    assert h.describe("e1").input != big  # tombstoned
    assert h.start_workflow("st_flow", big, "e1") == "e1"  # still recognised as the same start
    with pytest.raises(ExecutionAlreadyExists, match="different input"):
        h.start_workflow("st_flow", {"card": "5500"}, "e1")


def test_a_run_started_before_digests_is_compared_by_its_decoded_input(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_flow", {"a": 1}, "old")
    h.start_workflow("st_flow", None, "null")
    with h.store.begin() as tx:
        tx.conn.execute(executions.update().values(input_digest=None))
    assert h.start_workflow("st_flow", {"a": 1}, "old") == "old"
    assert h.start_workflow("st_flow", None, "null") == "null"
    with pytest.raises(ExecutionAlreadyExists, match="different input"):
        h.start_workflow("st_flow", {"a": 2}, "old")
    h.result("old", timeout=5)
    h.erase_payloads("old")  # erased and no digest: cannot tell, so the existing run answers
    assert h.start_workflow("st_flow", {"a": 2}, "old") == "old"


def test_the_digest_is_of_the_id_and_the_canonical_input():
    assert input_digest("r", {"a": 1, "b": 2}) == input_digest("r", {"b": 2, "a": 1})
    assert input_digest("r", [1, 2]) == input_digest("r", (1, 2))
    assert input_digest("r", {"a": 1}) != input_digest("s", {"a": 1})  # salted with the id
    assert input_digest("r", {"a": 1}).startswith("sha256:") and len(input_digest("r", 1)) == 71


# ── inside the application's transaction ───────────────────────────────────────────────────
def test_a_session_rollback_leaves_no_run_and_a_commit_starts_it(tmp_path):
    h = make(tmp_path)  # (blobs in the same transaction: tests/integration, on Postgres)
    engine = sa.create_engine(h.database_url)
    note = {"note": "n" * 100}
    with Session(engine) as session:
        h.start_workflow("st_flow", note, "tx1", connection=session)
        session.rollback()
    assert run_ids(h) == []
    factory = scoped_session(sessionmaker(engine))  # Flask-SQLAlchemy's db.session is one
    h.start_workflow("st_flow", note, "tx1", connection=factory)
    factory.commit()
    assert h.result("tx1", timeout=5) == note
    factory.remove()
    engine.dispose()


def test_a_core_connection_start_commits_with_the_connection(tmp_path):
    h = make(tmp_path)
    engine = sa.create_engine(h.database_url)
    with engine.connect() as conn:
        h.start_workflow("st_flow", 1, "c1", connection=conn)
        conn.rollback()
        h.start_workflow("st_flow", 2, "c2", connection=conn)
        conn.commit()
    assert run_ids(h) == ["c2"]
    assert h.describe("c2").status == "RUNNING"
    with pytest.raises(ValueError, match="AUTOCOMMIT"):
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            h.start_workflow("st_flow", 1, "c3", connection=conn)
    engine.dispose()


def test_what_a_start_cannot_join_is_refused(tmp_path):
    h = make(tmp_path)
    with pytest.raises(TypeError, match="takes a SQLAlchemy Connection or Session"):
        h.start_workflow("st_flow", 1, "x", connection=object())
    postgres = sa.create_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    with pytest.raises(ValueError, match="harvest database is sqlite"):
        h.start_workflow("st_flow", 1, "x", connection=Session(postgres))
    with pytest.raises(UnknownWorkflow):  # checked before anything else
        h.start_workflow("nope", 1, "x", connection=object())
    assert run_ids(h) == []


def test_start_on_commit_waits_for_the_session(tmp_path):
    h = make(tmp_path)
    engine = sa.create_engine(h.database_url)
    with Session(engine) as session:
        run_id = h.start_workflow_on_commit("st_flow", 7, "later", session=session)
        session.rollback()
    assert run_ids(h) == []
    with Session(engine) as session:
        h.start_workflow_on_commit("st_flow", 7, run_id, session=session)
        assert run_ids(h) == []
        session.commit()
    assert h.result(run_id, timeout=5) == 7
    with Session(engine) as session:  # a start that fails after the commit is logged, not raised
        h.start_workflow_on_commit("st_flow", 8, run_id, session=session)
        session.commit()
    assert h.describe(run_id).input == 7
    engine.dispose()


def test_an_announced_start_is_claimed_once(tmp_path):
    h = make(tmp_path)
    engine = sa.create_engine(h.database_url)
    with engine.connect() as conn:
        h.start_workflow("st_flow", 1, "n1", connection=conn)
        conn.commit()
    requested = h.store.decision_request("n1")[1]
    assert requested is not None
    notice = starts.start_notice("n1", requested, "harvest")
    assert starts.parse_notice(notice) == ("n1", requested, "harvest")
    assert starts.parse_notice("not json") is None
    with h.store.begin() as tx:
        assert starts.take_started(tx, [("n1", requested)], datetime.now(timezone.utc), "harvest") == 1
        assert [d.execution_id for d in tx.dispatches] == ["n1"]
    with h.store.begin() as tx:  # the second claimant finds the request already renewed
        assert starts.take_started(tx, [("n1", requested)], datetime.now(timezone.utc), "harvest") == 0
    engine.dispose()


def test_dbapi_connections_are_recognised_by_driver_and_transaction_state():
    class Psycopg3Like:
        __module__ = "psycopg"

        def __init__(self, autocommit: bool, status: int) -> None:
            self.autocommit = autocommit
            self.info = type("Info", (), {"transaction_status": status})()

        def cursor(self) -> None: ...

    Psycopg3Like.__module__ = "psycopg"
    assert dbapi.is_dbapi_connection(Psycopg3Like(False, 0))
    assert not dbapi.is_dbapi_connection(object())
    assert dbapi.in_transaction(Psycopg3Like(False, 0))  # the driver begins one
    assert not dbapi.in_transaction(Psycopg3Like(True, 0))  # autocommit, idle
    assert dbapi.in_transaction(Psycopg3Like(True, 2))  # autocommit inside conn.transaction()


# ── errors over HTTP, and the async client ──────────────────────────────────────────────────
@pytest.mark.parametrize(
    "exc, status",
    [
        (ExecutionNotFound("r"), 404),
        (UnknownWorkflow("w"), 404),
        (ExecutionAlreadyExists("r", "w", "input"), 409),
        (InvalidState("r", "COMPLETED", "cancel"), 409),
        (RetryRefused("r", "running", "no"), 409),
        (PayloadStoreError("gone"), 503),
        (InvalidExecutionId("a:b", "no"), 400),
        (HarvestError("other"), 400),
    ],
)
def test_each_error_has_one_http_status_and_body(exc, status):
    assert http_status(exc) == status
    body = error_body(exc)
    assert body["error"] == type(exc).__name__ and body["detail"] == str(exc)


def test_the_async_client_starts_signals_and_waits(tmp_path):
    h = make(tmp_path)

    async def scenario() -> tuple[Any, Any]:
        async with AsyncHarvest(h, wait_slice=0.2) as client:
            run_id = await client.start_workflow("st_flow", {"x": 1}, "a1")
            result = await client.result(run_id, timeout=5)
            with pytest.raises(ExecutionAlreadyExists):
                await client.start_workflow("st_flow", {"x": 2}, "a1")
            listed = [r.id for r in await client.list(workflow="st_flow")]
            return result, listed

    assert asyncio.run(scenario()) == ({"x": 1}, ["a1"])


@workflow
async def st_parked(ctx: WorkflowContext, data: Any) -> Any:
    """Waits for a signal: a run that stays live (RUNNING) in embedded mode."""
    return await ctx.wait_signal("go")


def make_parked(tmp_path: Any) -> Harvest:
    return make(tmp_path).register(st_parked)


def test_request_cancellation_sync_and_async_alike(tmp_path):
    h = make_parked(tmp_path)
    h.start_workflow("st_parked", 1, "sync")
    h.start_workflow("st_parked", 1, "async")

    async def scenario() -> list[Any]:
        async with AsyncHarvest(h, wait_slice=0.2) as client:
            first = await client.request_cancellation("async", reason="customer asked")
            again = await client.request_cancellation("async", reason="again")
            row = await client.describe("async")
            with pytest.raises(ExecutionNotFound):
                await client.request_cancellation("nobody")
            return [first, again, (row.status, row.display_status)]

    sync = [
        h.request_cancellation("sync", reason="customer asked"),
        h.request_cancellation("sync", reason="again"),
        (h.describe("sync").status, h.describe("sync").display_status),
    ]
    assert sync == asyncio.run(scenario()) == [True, False, ("RUNNING", "CANCELLING")]
    for run_id in ("sync", "async"):  # one request recorded, its reason the first one's
        requests = [e.event for e in h.history(run_id) if e.event.type == "WorkflowCancelRequested"]
        assert [r.reason for r in requests] == ["customer asked"]
    assert sorted(r.id for r in h.list(status="CANCELLING")) == ["async", "sync"]


def test_request_cancellation_of_a_finished_run_is_refused_sync_and_async(tmp_path):
    h = make_parked(tmp_path)
    h.start_workflow("st_flow", 1, "done")
    assert h.describe("done").status == "COMPLETED"
    with pytest.raises(InvalidState):
        h.request_cancellation("done")

    async def scenario() -> None:
        async with AsyncHarvest(h) as client:
            with pytest.raises(InvalidState):
                await client.request_cancellation("done")

    asyncio.run(scenario())
    assert not [e for e in h.history("done") if e.event.type == "WorkflowCancelRequested"]


def test_list_time_filters_sync_and_async_alike(tmp_path):
    h = make(tmp_path)
    h.start_workflow("st_other", 1, "early")
    time.sleep(0.02)
    middle = datetime.now(timezone.utc)
    time.sleep(0.02)
    h.start_workflow("st_other", 1, "late")
    created = {r.id: r.created_at for r in h.list()}
    assert created["early"] < middle <= created["late"]
    cases = [
        ({"created_after": middle}, ["late"]),
        ({"created_before": middle}, ["early"]),
        ({"created_after": created["late"]}, ["late"]),  # inclusive
        ({"created_before": created["late"]}, ["early"]),  # exclusive
        ({"created_after": created["early"], "created_before": middle}, ["early"]),
        ({"created_after": middle, "created_before": middle}, []),
        ({}, ["late", "early"]),
    ]  # newest first

    async def scenario() -> list[list[str]]:
        async with AsyncHarvest(h) as client:
            return [[r.id for r in await client.list(**kwargs)] for kwargs, _ in cases]

    expected = [ids for _, ids in cases]
    assert [[r.id for r in h.list(**kwargs)] for kwargs, _ in cases] == expected
    assert asyncio.run(scenario()) == expected


def test_every_later_decision_request_goes_to_the_starting_apps_queue(tmp_path):
    """Two apps on one database, each with its own decision queue: a request made by the other
    app's process (its sweeper firing a timer, re-sending a lost request, a signal) goes to the
    queue of the app that started the run (the DB-API start's statement is Postgres':
    tests/integration/test_task_calls.py checks the column it writes)."""
    h = make(tmp_path)
    now = datetime.now(timezone.utc)
    with h.store.begin() as tx:
        assert starts.start(tx, "app-a-1", "st_flow", 1, now, "app_a_decide")
    for run_id in ("app-a-1",):
        with h.store.begin() as tx:
            row = tx.lock(run_id)
            assert row is not None and row.decision_queue == "app_a_decide"
            assert row.decide_on("app_b_decide") == "app_a_decide"
            tx.request_decision(run_id, now, "app_b_decide", force=True)
            assert [d.queue for d in tx.dispatches] == ["app_a_decide"]
