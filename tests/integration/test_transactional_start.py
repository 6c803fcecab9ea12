"""A start inside the application's transaction, on real Postgres with a real worker: a rollback
leaves no run, no blob and no message; a commit gives a run whose first decision is dispatched at
once (the worker's lost-message pass is a minute away: webapps.py). On a SQLAlchemy Session and
Connection, on psycopg2 and psycopg 3 connections, and on an async SQLAlchemy session. Then id
reuse under concurrency: eighty concurrent starts of one id make one run and never a 500."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import psycopg2
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from harvest_celery import AsyncHarvest, ExecutionAlreadyExists, InvalidExecutionId

from .conftest import DATABASE_URL, LOG_DIR, wait_for

pytestmark = pytest.mark.integration

DSN = DATABASE_URL.replace("postgresql+psycopg2://", "postgresql://")
FAST = 15.0  # well under the worker's redispatch_after (60 s): dispatched on commit, not swept


@pytest.fixture(scope="module")
def engine() -> Any:
    engine = sa.create_engine(DATABASE_URL)
    yield engine
    engine.dispose()


@pytest.fixture
def h(webapps: Any) -> Any:
    harvest = webapps.app.extensions["harvest"].harvest
    yield harvest
    harvest.store.dispose()  # the pool the concurrent starts filled: give it back


def count(engine: Any, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())


def runs(engine: Any, run_id: str) -> int:
    return count(engine, "SELECT count(*) FROM harvest_executions WHERE id = :id", id=run_id)


def blobs(engine: Any, run_id: str) -> int:
    return count(engine, "SELECT count(*) FROM harvest_blobs WHERE key LIKE :k", k=f"{run_id}/%")


def order(tag: str, note: int = 500) -> dict[str, Any]:
    return {"tag": tag, "total": 7, "note": "n" * note}  # over the offload threshold: a blob


def decide_messages(run_id: str) -> int:
    text = (LOG_DIR / "webapps.log").read_text(errors="replace")
    return sum(
        1
        for line in text.splitlines()
        if f"Task harvest.decide[decide:{run_id}:" in line and line.endswith("] received")
    )


def assert_nothing_happened(engine: Any, webapps: Any, run_id: str, tag: str) -> None:
    assert runs(engine, run_id) == 0
    assert blobs(engine, run_id) == 0
    time.sleep(1.0)
    assert webapps.effects(tag) == []


def test_a_session_rollback_leaves_no_run_no_blob_and_no_message(engine, webapps, h, tag):
    run_id = f"sess-rb-{tag}"
    with Session(engine) as session:
        assert h.start_workflow("wa_checkout", order(tag), run_id, connection=session) == run_id
        assert runs(engine, run_id) == 0  # not visible before the application commits
        session.rollback()
    assert_nothing_happened(engine, webapps, run_id, tag)


def test_a_session_commit_starts_the_run_and_dispatches_it_once(engine, webapps, h, tag):
    run_id = f"sess-ok-{tag}"
    began = time.monotonic()
    with Session(engine) as session:
        h.start_workflow("wa_checkout", order(tag), run_id, connection=session)
        session.commit()
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"
    assert time.monotonic() - began < FAST
    assert blobs(engine, run_id) >= 1  # the offloaded input, written in the same transaction
    assert h.describe(run_id).input == order(tag)
    # the after-commit hook and the listening worker both tried: one claim won, one message
    wait_for(lambda: decide_messages(run_id) >= 1, what="the decision message in the worker log")
    assert decide_messages(run_id) == 1


def test_a_core_connection_is_dispatched_by_the_workers_listener(engine, webapps, h, tag):
    """A Core Connection has no after-commit hook: the worker hears the NOTIFY, which Postgres
    delivers on commit only."""
    run_id = f"conn-{tag}"
    with engine.connect() as conn:
        h.start_workflow("wa_checkout", order(tag, note=10), run_id, connection=conn)
        conn.rollback()
    assert_nothing_happened(engine, webapps, run_id, tag)
    with engine.connect() as conn:
        h.start_workflow("wa_checkout", order(tag, note=10), run_id, connection=conn)
        conn.commit()
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"


@pytest.mark.parametrize("driver", [psycopg2, psycopg], ids=["psycopg2", "psycopg3"])
def test_a_dbapi_connection_rolls_back_and_commits_with_the_application(engine, webapps, h, tag, driver):
    run_id = f"dbapi-{driver.__name__}-{tag}"
    conn = driver.connect(DSN)
    try:
        with conn.cursor() as cursor:  # the application's own write in the same transaction
            cursor.execute("CREATE TEMP TABLE app_rows (x int)")
            cursor.execute("INSERT INTO app_rows VALUES (1)")
        h.start_workflow("wa_checkout", order(tag), run_id, connection=conn)
        conn.rollback()
        assert_nothing_happened(engine, webapps, run_id, tag)
        h.start_workflow("wa_checkout", order(tag), run_id, connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"
    assert h.describe(run_id).input == order(tag)
    assert [e.event.type for e in h.history(run_id)][0] == "WorkflowStarted"
    assert h.history(run_id)[0].event.input == order(tag)  # the event's blob too


def test_a_connection_in_autocommit_is_refused_and_writes_nothing(engine, h, tag):
    conn = psycopg.connect(DSN, autocommit=True)
    try:
        with pytest.raises(ValueError, match="inside a transaction"):
            h.start_workflow("wa_checkout", order(tag), f"ac-{tag}", connection=conn)
        with conn.transaction():  # psycopg 3: an explicit transaction on an autocommit connection
            h.start_workflow("wa_checkout", order(tag), f"ac-{tag}", connection=conn)
    finally:
        conn.close()
    assert h.result(f"ac-{tag}", timeout=FAST) == f"charged:{tag}"


def test_start_on_commit_waits_for_the_session(engine, webapps, h, tag):
    with Session(engine) as session:
        run_id = h.start_workflow_on_commit("wa_checkout", order(tag), f"later-{tag}", session=session)
        assert runs(engine, run_id) == 0
        session.rollback()
    assert_nothing_happened(engine, webapps, run_id, tag)
    with Session(engine) as session:
        h.start_workflow_on_commit("wa_checkout", order(tag), run_id, session=session)
        assert runs(engine, run_id) == 0  # nothing before the commit
        session.commit()
    assert runs(engine, run_id) == 1
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"


# ── id reuse ────────────────────────────────────────────────────────────────────────────────
def _concurrently(n: int, work: Any) -> tuple[list[Any], list[BaseException]]:
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        barrier.wait()
        try:
            value = work(i)
        except BaseException as exc:  # noqa: BLE001 - every outcome is checked
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(value)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results, errors


def test_eighty_concurrent_starts_of_one_id_make_one_run(engine, webapps, h, tag):
    run_id = f"c80-{tag}"
    results, errors = _concurrently(80, lambda i: h.start_workflow("wa_checkout", order(tag), run_id))
    assert errors == []
    assert results == [run_id] * 80
    assert runs(engine, run_id) == 1
    assert (
        count(
            engine,
            "SELECT count(*) FROM harvest_events WHERE execution_id = :id AND type = 'WorkflowStarted'",
            id=run_id,
        )
        == 1
    )
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"
    assert [e["name"] for e in webapps.effects(tag)] == ["wa_charge"]


def test_concurrent_starts_with_two_inputs_make_one_run_and_conflicts(engine, h, tag):
    run_id = f"c2-{tag}"
    inputs = [order(tag, note=1), order(tag, note=2)]
    results, errors = _concurrently(40, lambda i: h.start_workflow("wa_checkout", inputs[i % 2], run_id))
    assert runs(engine, run_id) == 1
    winner = h.describe(run_id).input
    assert all(isinstance(e, ExecutionAlreadyExists) and e.conflict == "input" for e in errors), errors
    assert len(results) == sum(1 for i in range(40) if inputs[i % 2] == winner) == 20
    assert len(errors) == 20


def test_concurrent_starts_on_application_connections_make_one_run(engine, h, tag):
    """Each start waits on the others' uncommitted insert of the id (ON CONFLICT), then reads."""
    run_id = f"capp-{tag}"

    def start(i: int) -> str:
        conn = psycopg2.connect(DSN)
        try:
            got = h.start_workflow("wa_checkout", order(tag), run_id, connection=conn)
            time.sleep(0.05)  # hold the transaction open a little
            conn.commit()
            return str(got)
        finally:
            conn.close()

    results, errors = _concurrently(8, start)  # (a connection each: Postgres has ~100)
    assert errors == [] and results == [run_id] * 8
    assert runs(engine, run_id) == 1
    assert h.result(run_id, timeout=FAST) == f"charged:{tag}"


def test_a_conflicting_start_raises_and_writes_nothing(engine, h, tag):
    run_id = f"conf-{tag}"
    h.start_workflow("wa_checkout", order(tag), run_id)
    h.result(run_id, timeout=FAST)
    before = count(engine, "SELECT count(*) FROM harvest_events WHERE execution_id = :id", id=run_id)
    with pytest.raises(ExecutionAlreadyExists, match="different input") as caught:
        h.start_workflow("wa_checkout", order(tag, note=3), run_id)
    assert (caught.value.conflict, caught.value.status) == ("input", "COMPLETED")
    with pytest.raises(ExecutionAlreadyExists) as caught:
        h.start_workflow("wa_gate", order(tag), run_id)
    assert caught.value.conflict == "workflow"
    assert h.start_workflow("wa_checkout", order(tag, note=3), run_id, id_reuse="use_existing") == run_id
    assert count(engine, "SELECT count(*) FROM harvest_events WHERE execution_id = :id", id=run_id) == before


@pytest.mark.parametrize("bad", ["a:b", "a/b", "tab\there", "nul\x00", "x" * 201])
def test_an_invalid_id_is_refused_before_anything_is_written(engine, h, bad):
    before = count(engine, "SELECT count(*) FROM harvest_executions")
    with pytest.raises(InvalidExecutionId):
        h.start_workflow("wa_checkout", order("x"), bad)
    with pytest.raises(ValueError):  # an InvalidExecutionId is a ValueError too
        h.start_workflow("wa_checkout", order("x"), bad)
    assert count(engine, "SELECT count(*) FROM harvest_executions") == before


# ── the async client ────────────────────────────────────────────────────────────────────────
def test_the_async_client_never_blocks_the_event_loop(webapps, h, tag):
    async def scenario() -> tuple[Any, Any, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        async with AsyncHarvest(h, wait_slice=0.3) as client:
            run_id = await client.start_workflow("wa_checkout", order(tag), f"async-{tag}")
            result = await client.result(run_id, timeout=FAST)
            assert (await client.describe(run_id)).status == "COMPLETED"
            gate = await client.start_workflow("wa_gate", {"tag": tag}, f"agate-{tag}")
            beat = asyncio.create_task(ticker())
            waiter = asyncio.create_task(client.result(gate, timeout=FAST))
            await asyncio.sleep(1.0)  # the gate waits for its signal; so does the client
            assert not waiter.done()
            waited = ticks
            await client.signal(gate, "go", "opened")
            gated = await waiter
            beat.cancel()
        return result, gated, waited

    result, gated, waited = asyncio.run(scenario())
    assert (result, gated) == (f"charged:{tag}", "opened")
    assert waited > 50  # ~100 ticks in that second: the loop ran while the client waited


def test_the_async_client_joins_an_async_session(engine, webapps, h, tag):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    url = DATABASE_URL.replace("postgresql+psycopg2://", "postgresql+psycopg_async://")

    async def scenario() -> None:
        aengine = create_async_engine(url)
        client = AsyncHarvest(h)
        try:
            async with AsyncSession(aengine) as session:
                await client.start_workflow("wa_checkout", order(tag), f"as-rb-{tag}", connection=session)
                await session.rollback()
            async with AsyncSession(aengine) as session:
                await client.start_workflow("wa_checkout", order(tag), f"as-ok-{tag}", connection=session)
                await session.commit()
            assert await client.result(f"as-ok-{tag}", timeout=FAST) == f"charged:{tag}"
        finally:
            client.close()
            await aengine.dispose()

    asyncio.run(scenario())
    assert runs(engine, f"as-rb-{tag}") == 0 and blobs(engine, f"as-rb-{tag}") == 0
