"""Tracing across real worker processes (docs/observability.md, "Tracing"; issue 29, "What it
must show"): Postgres, the broker, two Celery workers with ``opentelemetry-instrumentation-celery``
active, and each process's finished spans read back from Redis (``tracing_app``).

- the saga (charge, ship fails, refund) is one trace under a test "request" span, then
  ``harvest.start``; the run span is emitted at close with the pre-allocated id and the run's
  times; every decision, activity and compensation span hangs off the run span or off Celery's
  task span under it; a 20-step run has the tree depth of a 2-step one;
- a timer wait, then a step on the other worker process, stays in the same trace;
- a cold replay (the worker restarted mid-run), a probe and a query add no span;
- no marker string of the input or the exception text is in any span.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery._core.engine import replay_history
from harvest_celery._store.schema import executions

from .conftest import Worker, wait_for
from .test_observability import _fresh_database

APP = "tests.integration.tracing_app"
PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 9  # this module's worker A
TRACED = {"HARVEST_TEST_TRACE_WORKER": "1", "HARVEST_TRACING": "1"}
HARVEST_SPANS = ("harvest.decision", "harvest.activity", "harvest.compensation")


@pytest.fixture(scope="module")
def env(redis_client: Any) -> Iterator[SimpleNamespace]:
    """Worker A (decisions and ``trace_a``) and worker B (``trace_b``), both traced; this process
    instrumented as a web application would be."""
    from tests.integration import tracing_app

    _fresh_database(tracing_app.DATABASE_URL.rsplit("/", 1)[1])
    tracing_app.harvest.migrate()
    redis_client.delete(tracing_app.SPANS_KEY, tracing_app.SENTRY_KEY)
    a = Worker(
        "trace-a",
        f"{tracing_app.DECIDE},{tracing_app.QUEUE_A}",
        {**TRACED, "HARVEST_METRICS_PORT": str(PORT)},
        app=APP,
    )
    b = Worker("trace-b", tracing_app.QUEUE_B, {**TRACED, "HARVEST_METRICS_PORT": ""}, app=APP)
    instrumentor = tracing_app.instrument()
    try:
        a.start()
        b.start()
        yield SimpleNamespace(app=tracing_app, redis=redis_client, a=a, b=b)
    finally:
        instrumentor.uninstrument()
        a.stop()
        b.stop()


def _spans(env: SimpleNamespace) -> list[dict[str, Any]]:
    return [json.loads(x) for x in env.redis.lrange(env.app.SPANS_KEY, 0, -1)]


def _trace(env: SimpleNamespace, trace_id: str) -> list[dict[str, Any]]:
    return [s for s in _spans(env) if s["context"]["trace_id"] == trace_id]


def _start(env: SimpleNamespace, workflow: str, arg: Any) -> tuple[str, str, str]:
    """Start under a test "request" span: (run id, the request's trace id, its span id)."""
    tracer = env.app.provider.get_tracer("test")
    rid = f"{workflow}-{uuid.uuid4().hex[:8]}"
    with tracer.start_as_current_span("request") as request:
        env.app.harvest.start_workflow(workflow, arg, execution_id=rid)
    ctx = request.get_span_context()
    return rid, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _closed_trace(env: SimpleNamespace, rid: str, trace_id: str, workflow: str) -> list[dict[str, Any]]:
    """The trace once its run span is in (emitted by the closing worker after the commit),
    every span's parent too (a Celery task span ends at ``task_postrun``, after harvest's own
    spans of the attempt: another process may close the run first), and one attempt span per
    ``ActivityStarted`` (the last attempt's span is emitted after its outcome commits, which may
    be after the commit that closed the run)."""
    attempts = sum(h.event.type == "ActivityStarted" for h in env.app.harvest.history(rid))

    def complete() -> list[dict[str, Any]] | None:
        spans = _trace(env, trace_id)
        ids = {s["context"]["span_id"] for s in spans}
        closed = any(s["name"] == f"harvest.run {workflow}" for s in spans)
        whole = all(s["parent"] is None or s["parent"]["span_id"] in ids for s in spans)
        seen = sum(s["name"].startswith(("harvest.activity ", "harvest.compensation ")) for s in spans)
        return spans if closed and whole and seen >= attempts else None

    return wait_for(complete, timeout=30, what="the whole trace")


def _stored(env: SimpleNamespace, rid: str) -> Any:
    with env.app.harvest.store.begin() as tx:
        return tx.conn.execute(
            sa.select(executions.c.traceparent, executions.c.created_at, executions.c.closed_at).where(
                executions.c.id == rid
            )
        ).one()


def _ns(at: Any) -> int:
    return int(at.timestamp() * 1_000_000_000)


def _depth(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> int:
    depth = 1
    while span["parent"] is not None and span["parent"]["span_id"] in by_id:
        span, depth = by_id[span["parent"]["span_id"]], depth + 1
    return depth


def _under_run(span: dict[str, Any], run_id: str, by_id: dict[str, dict[str, Any]]) -> bool:
    """Parented on the run span, or on a Celery span whose own ancestry reaches it."""
    parent = span["parent"]
    if parent is None:
        return False
    if parent["span_id"] == run_id:
        return True
    above = by_id.get(parent["span_id"])
    return above is not None and above["kind"] == "CONSUMER" and _reaches(above, run_id, by_id)


def _reaches(span: dict[str, Any], run_id: str, by_id: dict[str, dict[str, Any]]) -> bool:
    while span["parent"] is not None:
        if span["parent"]["span_id"] == run_id:
            return True
        if span["parent"]["span_id"] not in by_id:
            return False
        span = by_id[span["parent"]["span_id"]]
    return False


def test_the_saga_is_one_trace_from_the_request_to_the_refund(env: SimpleNamespace) -> None:
    rid, trace_id, request_id = _start(env, "trace_saga", {"id": 7, "note": env.app.MARKER})
    assert env.app.harvest.result(rid, timeout=60) == "refunded"
    spans = _closed_trace(env, rid, trace_id, "trace_saga")
    by_id = {s["context"]["span_id"]: s for s in spans}
    (start,) = [s for s in spans if s["name"] == "harvest.start"]
    assert start["parent"]["span_id"] == request_id
    (run,) = [s for s in spans if s["name"] == "harvest.run trace_saga"]
    stored = _stored(env, rid)
    assert stored.traceparent.split("-")[1:3] == [trace_id, run["context"]["span_id"]]  # pre-allocated
    assert run["parent"]["span_id"] == start["context"]["span_id"]
    assert abs(run["start"] - _ns(stored.created_at)) < 1_000_000
    assert abs(run["end"] - _ns(stored.closed_at)) < 1_000_000
    ours = [s for s in spans if s["name"].startswith(HARVEST_SPANS)]
    names = sorted(s["name"] for s in ours if not s["name"].startswith("harvest.decision"))
    assert names == [
        "harvest.activity trace_charge",
        "harvest.activity trace_ship",
        "harvest.compensation trace_refund",
    ]
    assert [s for s in ours if s["name"].startswith("harvest.decision")]
    for span in ours:
        assert _under_run(span, run["context"]["span_id"], by_id), span["name"]
    # Celery's instrumentation is active on both paths: every attempt's span is a child of its
    # task span, itself under the run span directly (eager: harvest makes the run span current)
    # or through the publish span of the message harvest sent with the run span current
    for span in ours:
        if span["name"].startswith("harvest.decision"):
            assert span["parent"]["span_id"] == run["context"]["span_id"]
            continue
        task = by_id[span["parent"]["span_id"]]
        assert task["kind"] == "CONSUMER" and task["name"].startswith("run/"), task["name"]
        above = by_id[task["parent"]["span_id"]]
        assert above is run or (
            above["kind"] == "PRODUCER" and above["parent"]["span_id"] == run["context"]["span_id"]
        )
    (ship,) = [s for s in ours if s["name"] == "harvest.activity trace_ship"]
    assert set(ship["attributes"]) == {
        "harvest.execution_id",
        "harvest.workflow",
        "harvest.activity",
        "harvest.activity_id",
        "harvest.attempt",
        "harvest.queue",
        "harvest.outcome",
    }
    assert (
        ship["attributes"]["harvest.outcome"] == "failed" and ship["attributes"]["harvest.queue"] == "trace_b"
    )
    assert ship["pid"] != [s for s in ours if s["name"] == "harvest.activity trace_charge"][0]["pid"]
    # celery_error_detail="type": neither the input nor the exception text leaves harvest
    assert env.app.MARKER not in json.dumps(spans)


def test_a_20_step_run_is_as_deep_as_a_2_step_one(env: SimpleNamespace) -> None:
    depths = {}
    for n in (2, 20):
        rid, trace_id, _ = _start(env, "trace_steps", n)
        assert env.app.harvest.result(rid, timeout=90) == n
        spans = _closed_trace(env, rid, trace_id, "trace_steps")
        steps = [s for s in spans if s["name"].startswith("harvest.activity trace_step")]
        assert len(steps) == n
        by_id = {s["context"]["span_id"]: s for s in spans}
        depths[n] = max(_depth(s, by_id) for s in spans)
    assert depths[2] == depths[20]


def test_a_timer_then_a_step_on_the_other_worker_stay_in_the_trace(env: SimpleNamespace) -> None:
    rid, trace_id, _ = _start(env, "trace_timer", 1)
    assert env.app.harvest.result(rid, timeout=60) == 3
    spans = _closed_trace(env, rid, trace_id, "trace_timer")
    (run,) = [s for s in spans if s["name"] == "harvest.run trace_timer"]
    assert run["end"] - run["start"] >= 5_000_000_000
    by_id = {s["context"]["span_id"]: s for s in spans}
    (a,) = [s for s in spans if s["name"] == "harvest.activity trace_step"]
    (b,) = [s for s in spans if s["name"] == "harvest.activity trace_step_b"]
    assert a["pid"] != b["pid"]  # another worker process, the same trace
    for span in (a, b):
        assert _under_run(span, run["context"]["span_id"], by_id)


def test_a_cold_replay_a_probe_and_a_query_add_no_span(env: SimpleNamespace) -> None:
    rid, trace_id, _ = _start(env, "trace_wait", 1)
    harvest = env.app.harvest
    wait_for(lambda: harvest.query(rid, "at") == 2, timeout=30, what="the first step")
    env.a.restart()  # the decision worker's warm replay is gone: the next decision replays cold
    harvest.signal(rid, "go")
    assert harvest.result(rid, timeout=60) == 3
    spans = _closed_trace(env, rid, trace_id, "trace_wait")
    counted = len(spans)
    replay_history(harvest.registry.workflow("trace_wait"), rid, harvest.history(rid), harvest.registry)
    assert harvest.query(rid, "at") == 3
    names = sorted(s["name"] for s in _trace(env, trace_id) if s["name"].startswith("harvest."))
    assert len(_trace(env, trace_id)) == counted
    decisions = [n for n in names if n.startswith("harvest.decision")]
    assert len(decisions) == 4  # the live frontier: start, first step, signal, last step
    assert names.count("harvest.activity trace_step") == 1
    assert names.count("harvest.activity trace_step_b") == 1
    assert names.count("harvest.run trace_wait") == 1 and names.count("harvest.start") == 1


def _sentry(env: SimpleNamespace, rid: str) -> list[dict[str, Any]]:
    events = [json.loads(x) for x in env.redis.lrange(env.app.SENTRY_KEY, 0, -1)]
    return [e for e in events if e.get("tags", {}).get("harvest.execution_id") == rid]


def test_failed_attempts_reach_sentry_with_their_tags_on_both_paths(env: SimpleNamespace) -> None:
    """Broker path (``trace_ship``, delivered to B): through Sentry's Celery integration; eager
    path (``trace_fail_a``, run eagerly on A): captured by harvest. One event each, tagged, with
    only the type under ``celery_error_detail="type"``."""
    order = {"id": 9, "note": env.app.MARKER}
    saga = env.app.harvest.start_workflow("trace_saga", order)
    eager = env.app.harvest.start_workflow("trace_eager_fail", order)
    assert env.app.harvest.result(saga, timeout=60) == "refunded"
    assert env.app.harvest.result(eager, timeout=60) == "failed"
    wait_for(lambda: _sentry(env, saga) and _sentry(env, eager), timeout=30, what="the Sentry events")
    for rid, activity in ((saga, "trace_ship"), (eager, "trace_fail_a")):
        (event,) = _sentry(env, rid)
        assert event["tags"]["harvest.activity"] == activity and event["tags"]["harvest.attempt"] == "1"
        assert event["exception"]["values"][-1]["type"] == "RedactedActivityError"
        assert env.app.MARKER not in json.dumps(event)
    history = env.app.harvest.history(eager)
    started = [e for e in history if e.event.type == "ActivityStarted"]
    assert len(started) == 2  # one claim per attempt: the eager prerun never claims again
