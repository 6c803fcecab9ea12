"""Existing Celery tasks called durably with Celery's whole call signature (issue 22), on real
Postgres, Redis and Celery worker processes: ``ctx.execute_task`` and ``Harvest.start_task`` give
what ``.delay().get()`` gives on the same worker, signatures are honoured as Celery would, the
engine's retries and kill -9 keep the recorded arguments, a countdown is a durable timer, erasure
leaves no argument behind, and every refused call writes nothing and sends nothing."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery, signature

from harvest_celery import (
    ExecutionAlreadyExists,
    Harvest,
    InvalidExecutionId,
    InvalidTaskCall,
    PayloadNotSerializable,
    UnknownActivity,
    WorkflowCancelledError,
    WorkflowFailed,
)
from harvest_celery._core.invocation import REFUSED_OPTIONS

from .conftest import Worker, wait_for


@pytest.fixture(scope="module")
def tc(harvest: Any, redis_client: Any) -> Any:
    from tests.integration import task_calls_app

    app = "tests.integration.task_calls_app"
    decider = Worker("tc-decide", task_calls_app.DECIDE, app=app)
    runner = Worker("tc-tasks", f"{task_calls_app.QUEUE},celery", app=app)
    decider.start()
    runner.start()
    task_calls_app.workers = {"decide": decider, "tasks": runner}
    try:
        yield task_calls_app
    finally:
        runner.stop()
        decider.stop()


def calls(redis_client: Any, tag: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in redis_client.lrange(f"tc:{tag}", 0, -1)]


def history(h: Harvest, rid: str) -> list[Any]:
    return [item.event for item in h.history(rid)]


SHAPES = [
    ("add", (2, 3), {}),
    ("scale", ([1, 2],), {"factor": 3}),
    ("spread", (1, (2, 3)), {"k": "v"}),
    ("bound", (4, 5), {"flag": True}),
]


def _celery_results(tc: Any) -> list[Any]:
    from tests.integration import task_calls_tasks as tasks

    return [getattr(tasks, name).delay(*args, **kwargs).get(timeout=30) for name, args, kwargs in SHAPES]


def test_execute_task_gives_what_delay_gives(tc):
    rid = tc.harvest.start_workflow("tc_shapes", None)
    assert tc.harvest.result(rid, timeout=60) == _celery_results(tc)
    scheduled = [e for e in history(tc.harvest, rid) if e.type == "ActivityScheduled"]
    assert [e.call_convention for e in scheduled] == ["args_kwargs"] * 4
    assert scheduled[2].input == {"args": [1, [2, 3]], "kwargs": {"k": "v"}}
    assert {e.queue for e in scheduled} == {tc.QUEUE}  # the adopted definition's queue


def test_start_task_gives_what_delay_gives(tc):
    from tests.integration import task_calls_tasks as tasks

    runs = [tc.harvest.start_task(getattr(tasks, n), *a, **k) for n, a, k in SHAPES]
    assert [tc.harvest.result(r, timeout=60) for r in runs] == _celery_results(tc)
    # the bound task saw the call in Celery's own request, as the message carried it
    assert tc.harvest.result(runs[3]) == {"args": [4, 5], "kwargs": {"flag": True}}


def test_execute_activity_of_an_adopted_task_keeps_one_argument(tc):
    rid = tc.harvest.start_workflow("tc_single", {"args": [1], "kwargs": {"k": 2}})
    # recorded without a convention: the dict is the task's one argument, not a call
    assert tc.harvest.result(rid, timeout=30) == {"args": [{"args": [1], "kwargs": {"k": 2}}], "kwargs": {}}


def test_signatures_are_called_as_celery_would(tc):
    from tests.integration import task_calls_tasks as tasks

    h = tc.harvest
    assert h.result(h.start_task(tasks.spread.s(2, 3), 1), timeout=30) == {"args": [1, 2, 3], "kwargs": {}}
    assert h.result(h.start_task(tasks.add.si(4, 5)), timeout=30) == 9
    merged = h.start_task(tasks.spread.s(1, a=1, b=2), b=3, c=4)
    assert h.result(merged, timeout=30) == {"args": [1], "kwargs": {"a": 1, "b": 3, "c": 4}}
    assert h.result(h.start_task(tasks.scale.s(5).set(queue=tc.QUEUE), factor=4), timeout=30) == 20


def test_the_same_call_twice_is_one_run_and_another_call_conflicts(tc):
    from tests.integration import task_calls_tasks as tasks

    rid = f"tc-same-{uuid.uuid4().hex[:8]}"
    frozen = tasks.add.s(1, 2)
    frozen.freeze()  # Celery's own task_id in its options: dropped
    assert tc.harvest.start_task(tasks.add.s(1, 2), execution_id=rid) == rid
    assert tc.harvest.start_task(frozen, execution_id=rid) == rid
    assert tc.harvest.result(rid, timeout=30) == 3
    with tc.harvest.store.engine.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM harvest_executions WHERE id = :i"), {"i": rid}
        ).scalar()
    assert count == 1
    with pytest.raises(ExecutionAlreadyExists) as info:
        tc.harvest.start_task(tasks.add.s(1, 3), execution_id=rid)
    assert info.value.conflict == "input"


@pytest.mark.parametrize("succeed_on", [3, 9])
def test_autoretry_for_becomes_engine_attempts_with_the_same_arguments(tc, redis_client, succeed_on):
    from tests.integration import task_calls_tasks as tasks

    tag = uuid.uuid4().hex[:12]
    rid = tc.harvest.start_task(tasks.flaky, tag, 7, succeed_on=succeed_on)
    if succeed_on == 3:
        assert tc.harvest.result(rid, timeout=30) == "charged 7 after 3"
    else:
        with pytest.raises(WorkflowFailed, match="ConnectionError: gateway timeout on call 3"):
            tc.harvest.result(rid, timeout=30)
    seen = calls(redis_client, tag)
    assert [(c["args"], c["kwargs"]) for c in seen] == [([tag, 7], {"succeed_on": succeed_on})] * 3
    failed = 2 if succeed_on == 3 else 3
    errors = [(e.attempt, e.error_type) for e in tc.harvest.store.attempt_errors(rid) if e.activity_id]
    assert errors == [(n, "ConnectionError") for n in range(1, failed + 1)]
    started = [e.attempt for e in history(tc.harvest, rid) if e.type == "ActivityStarted"]
    assert started == [1, 2, 3]  # engine attempts; Celery published no retry of its own
    assert redis_client.llen(tc.QUEUE) == 0


def test_kill_9_mid_body_retries_with_the_same_recorded_arguments(tc, redis_client):
    from tests.integration import task_calls_tasks as tasks

    tag = uuid.uuid4().hex[:12]
    rid = tc.harvest.start_task(tasks.stuck_once, tag, [1, {"a": 2}], note="n")
    wait_for(lambda: calls(redis_client, tag), timeout=30, what="the first call")
    tc.workers["tasks"].kill9()
    tc.workers["tasks"].start()
    assert tc.harvest.result(rid, timeout=60) == {"items": [1, {"a": 2}], "note": "n", "calls": 2}
    seen = calls(redis_client, tag)
    assert [(c["args"], c["kwargs"]) for c in seen] == [([tag, [1, {"a": 2}]], {"note": "n"})] * 2
    events = history(tc.harvest, rid)
    assert [e.attempt for e in events if e.type == "ActivityStarted"] == [1, 2]
    assert [e.type for e in events].count("ActivityCompleted") == 1


def _timer_started(h: Harvest, rid: str) -> Any:
    return next((e for e in history(h, rid) if e.type == "TimerStarted"), None)


def test_a_countdown_survives_a_kill_9_of_the_decision_worker(tc, redis_client):
    from tests.integration import task_calls_tasks as tasks

    tag = uuid.uuid4().hex[:12]
    rid = tc.harvest.start_task(tasks.noted.s(tag, "v").set(countdown=4))
    timer = wait_for(lambda: _timer_started(tc.harvest, rid), timeout=30, what="the durable timer")
    # the shared workers' sweepers (another app, decision queue "harvest") may fire this timer:
    # the decision it requests goes to the run's own queue, never to theirs
    with tc.harvest.store.engine.connect() as conn:
        queue = conn.execute(
            sa.text("SELECT decision_queue FROM harvest_executions WHERE id = :i"), {"i": rid}
        ).scalar()
    assert queue == tc.DECIDE
    tc.workers["decide"].kill9()
    tc.workers["decide"].start()
    assert tc.harvest.result(rid, timeout=60) == "v"
    seen = calls(redis_client, tag)
    assert len(seen) == 1
    assert seen[0]["at"] >= datetime.fromisoformat(timer.fire_at).timestamp()


def test_a_cancel_during_the_wait_means_the_task_never_runs(tc, redis_client):
    from tests.integration import task_calls_tasks as tasks

    tag = uuid.uuid4().hex[:12]
    # an eta a few seconds ahead, so the timer's due time passes while the test watches
    eta = datetime.now(timezone.utc) + timedelta(seconds=3)
    rid = tc.harvest.start_task(tasks.noted.s(tag, "w").set(eta=eta))
    timer = wait_for(lambda: _timer_started(tc.harvest, rid), timeout=30, what="the durable timer")
    assert tc.harvest.cancel_workflow_execution(rid, "not wanted") == "CANCELLED"
    with pytest.raises(WorkflowCancelledError):
        tc.harvest.result(rid, timeout=30)
    due = datetime.fromisoformat(timer.fire_at).timestamp()
    wait_for(lambda: time.time() > due + 3, timeout=30, what="past the due time and a few sweeps")
    assert "ActivityScheduled" not in [e.type for e in history(tc.harvest, rid)]
    assert calls(redis_client, tag) == []


def test_erasing_a_finished_start_task_run_leaves_none_of_its_arguments(tc):
    from tests.integration import task_calls_tasks as tasks

    secret = f"secret-{uuid.uuid4().hex}"
    rid = tc.harvest.start_task(tasks.spread, secret, card=f"{secret}-kw")
    tc.harvest.result(rid, timeout=30)
    tc.harvest.erase_payloads(rid)
    with tc.harvest.store.engine.connect() as conn:
        for table in (
            "harvest_executions",
            "harvest_events",
            "harvest_activity_tasks",
            "harvest_attempt_errors",
        ):
            rows = conn.execute(sa.text(f"SELECT * FROM {table}")).fetchall()
            assert not [r for r in rows if secret in repr(tuple(r))], table


def test_a_signature_passed_to_execute_task_fails_the_run_before_anything_is_recorded(tc):
    rid = tc.harvest.start_workflow("tc_signature", None)
    with pytest.raises(WorkflowFailed, match="InvalidTaskCall: ctx.execute_task takes a task or its name"):
        tc.harvest.result(rid, timeout=30)
    assert "ActivityScheduled" not in [e.type for e in history(tc.harvest, rid)]
    assert tc.harvest.store.activity_rows(rid) == []


OLD_START = """
WITH run AS (
    INSERT INTO harvest_executions (id, workflow_type, status, input, input_digest, next_seq,
                                    created_at, updated_at, decision_requested_at, nd_block_count)
    VALUES (%(id)s, %(workflow_type)s, %(status)s, CAST(%(input)s AS jsonb), %(digest)s, 1,
            %(now)s, %(now)s, %(now)s, 0)
    RETURNING id
)
INSERT INTO harvest_events (execution_id, seq, type, data, recorded_at)
SELECT id, 0, %(event_type)s, CAST(%(event)s AS jsonb), %(now)s FROM run
"""  # a 0007-era build's start, frozen here: this build's own start names later columns


def test_a_run_started_before_the_migration_completes_after_it(tc, redis_client):
    """A run started on a schema at 0007 (its run row and WorkflowStarted written by an older
    build's statement, its first decision requested), then the migrations, then a worker of
    this build: the run completes, its adopted call recorded without a convention (one
    argument). The worker's sweeper sends the decision the row requested."""
    import psycopg2

    from harvest_celery._core import events as ev
    from harvest_celery._payloads.digest import input_digest
    from harvest_celery._store.dbapi import _start_params
    from harvest_celery._store.migrate import upgrade
    from harvest_celery._store.records import utcnow

    from .conftest import ADMIN_URL, DB_NAME

    name = f"{DB_NAME}_tc_old"
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    upgrade(url, "0007")
    old = Harvest(url, Celery("tc_old", broker=tc.BROKER_URL), decision_queue="tc_old_decide")
    old.register(tc.tc_single)
    old.adopt_task("tc.spread", queue="tc_old_q")
    rid, data = uuid.uuid4().hex, {"args": [1], "kwargs": {"k": 2}}
    event = ev.WorkflowStarted("tc_single", data).to_data()
    params = _start_params(rid, "tc_single", data, event, input_digest(rid, data), utcnow(), "tc_old_decide")
    raw = psycopg2.connect(dbname=name, user="postgres", host="127.0.0.1", port=5432)
    try:
        with raw, raw.cursor() as cur:  # one transaction, committed on leaving
            cur.execute(OLD_START, params)
    finally:
        raw.close()
    upgrade(url)
    worker = Worker(
        "tc-old",
        "tc_old_decide,tc_old_q",
        {"HARVEST_TEST_DATABASE_URL": url, "HARVEST_TEST_TC_QUEUES": "tc_old_decide,tc_old_q"},
        app="tests.integration.task_calls_app",
    )
    worker.start()
    try:
        assert old.result(rid, timeout=60) == {"args": [{"args": [1], "kwargs": {"k": 2}}], "kwargs": {}}
        scheduled = [e for e in history(old, rid) if e.type == "ActivityScheduled"]
        assert [e.call_convention for e in scheduled] == [None]
    finally:
        worker.stop()
        old.store.dispose()
        with admin.connect() as conn:
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                {"d": name},
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


# ── refused calls: nothing written, nothing sent ─────────────────────────────────────────────
@pytest.fixture(scope="module")
def quiet(tc: Any, redis_client: Any) -> Any:
    """A Harvest whose decision queue and task queue no worker consumes, so a message sent by a
    refused call would stay in the broker."""
    app = Celery("tc_quiet", broker=tc.BROKER_URL)
    h = Harvest(tc.DATABASE_URL, app, decision_queue="tc_quiet_decide")
    h.adopt_task("tc.add", queue="tc_quiet_q")
    yield h
    h.store.dispose()


def _written(h: Harvest) -> dict[str, int]:
    with h.store.engine.connect() as conn:
        return {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar()
            for t in ("harvest_executions", "harvest_events", "harvest_activity_tasks", "harvest_outbox")
        }


def _add() -> Any:
    from tests.integration import task_calls_tasks as tasks

    return tasks.add


REFUSED = [
    ("unknown name", lambda h: h.start_task("tc.nope", 1), UnknownActivity, "adopt_task"),
    ("not a task", lambda h: h.start_task(object()), UnknownActivity, "is not a Celery task"),
    ("a set", lambda h: h.start_task(_add(), {1}, 2), PayloadNotSerializable, "argument 0 of task 'tc.add'"),
    (
        "int key",
        lambda h: h.start_task(signature("tc.add", args=(1,), kwargs={1: 2})),
        PayloadNotSerializable,
        "keyword argument 1",
    ),
    ("immutable", lambda h: h.start_task(_add().si(1, 2), 3), InvalidTaskCall, "immutable signature"),
    (
        "naive eta",
        lambda h: h.start_task(_add().s(1, 2).set(eta=datetime(2030, 1, 1))),
        InvalidTaskCall,
        "aware",
    ),
    (
        "countdown+eta",
        lambda h: h.start_task(_add().s(1, 2).set(countdown=1, eta=datetime.now(timezone.utc))),
        InvalidTaskCall,
        "countdown and eta",
    ),
    ("negative", lambda h: h.start_task(_add().s(1, 2).set(countdown=-1)), InvalidTaskCall, "non-negative"),
    ("unknown option", lambda h: h.start_task(_add().s(1, 2).set(shadow="s")), InvalidTaskCall, "'shadow'"),
    ("bad id", lambda h: h.start_task(_add(), 1, 2, execution_id="a:b"), InvalidExecutionId, "':'"),
] + [
    (
        f"option {name}",
        lambda h, n=name: h.start_task(_add().s(1, 2).set(**{n: 1})),
        InvalidTaskCall,
        repr(name),
    )
    for name in sorted(REFUSED_OPTIONS)
]


@pytest.mark.parametrize(("case", "call", "error", "text"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_start_task_writes_nothing_and_sends_nothing(quiet, redis_client, case, call, error, text):
    before = _written(quiet)
    with pytest.raises(error) as info:
        call(quiet)
    assert text in str(info.value)
    if isinstance(info.value, InvalidTaskCall):
        assert info.value.option
    assert _written(quiet) == before
    assert redis_client.llen("tc_quiet_decide") == 0 and redis_client.llen("tc_quiet_q") == 0
