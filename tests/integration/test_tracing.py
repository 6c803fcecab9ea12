"""Tracing across real worker processes (docs/observability.md, "Tracing"; issue 29, "What it
must show"): Postgres, the broker, two Celery workers with ``opentelemetry-instrumentation-celery``
active, and each process's finished spans read back from Redis (``tracing_app``).

- the saga (charge, ship fails, refund) is one trace under a test "request" span, then
  ``harvest.start``; the run span is emitted at close with the pre-allocated id and the run's
  times; every decision, activity and compensation span hangs off the run span or off Celery's
  task span under it; a 20-step run has the tree depth of a 2-step one;
- a timer wait, then a step on the other worker process, stays in the same trace;
- a cold replay (the worker restarted mid-run), a probe, a query and a post-cancel decision
  add no span and no Sentry event;
- a decision killed before its commit emitted nothing, and its retake emits one decision span;
- a child's run span is a child of its parent's; continue-as-new keeps the trace (each run
  under the start span, linked to the run it continues); a reset fork and a schedule tick (fired
  by a worker's sweeper) start traces of their own;
- eager and delivered attempts of the same activities give the same tree shape (names,
  parentage, attribute keys) and the same Sentry events (count, tags);
- a workflow failure reaches Sentry once, with file and line; a replay of it does not report;
- no marker string of the input or the exception text is in any span or Sentry event.

The queues carry a suffix of this session's own (``HARVEST_TEST_DL_SUFFIX``, ``tracing_app``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from harvest_celery import WorkflowCancelledError, WorkflowFailed
from harvest_celery._core.engine import replay_history
from harvest_celery._runtime import sentry
from harvest_celery._store.schema import executions

from .conftest import Worker, wait_for, workers_decide
from .test_observability import _fresh_database

APP = "tests.integration.tracing_app"
PORT = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 9  # this module's worker A
TRACED = {"HARVEST_TEST_TRACE_WORKER": "1", "HARVEST_TRACING": "1"}
HARVEST_SPANS = ("harvest.decision", "harvest.activity", "harvest.compensation")


@pytest.fixture(scope="module")
def env(redis_client: Any) -> Iterator[SimpleNamespace]:
    """Worker A (decisions and ``trace_a``) and worker B (``trace_b``), both traced; this process
    instrumented as a web application would be."""
    suffix = f"_s{os.environ.get('HARVEST_TEST_SLOT', '0')}_{uuid.uuid4().hex[:8]}"
    os.environ["HARVEST_TEST_DL_SUFFIX"] = suffix  # before the import; the workers inherit it
    from tests.integration import tracing_app

    assert tracing_app.DECIDE.endswith(suffix), "tracing_app was imported before the fixture"
    _fresh_database(tracing_app.DATABASE_URL.rsplit("/", 1)[1])
    tracing_app.harvest.migrate()
    redis_client.delete(tracing_app.SPANS_KEY, tracing_app.SENTRY_KEY, tracing_app.CRASH_KEY)
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


def _start(env: SimpleNamespace, workflow: str, arg: Any, rid: str | None = None) -> tuple[str, str, str]:
    """Start under a test "request" span: (run id, the request's trace id, its span id)."""
    tracer = env.app.provider.get_tracer("test")
    rid = rid or f"{workflow}-{uuid.uuid4().hex[:8]}"
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
        ship["attributes"]["harvest.outcome"] == "failed"
        and ship["attributes"]["harvest.queue"] == env.app.QUEUE_B
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
    assert _sentry(env, rid) == []  # nor a Sentry event


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


def _decisions(spans: list[dict[str, Any]]) -> list[str]:
    return [s["name"] for s in spans if s["name"].startswith("harvest.decision")]


def _of_run(env: SimpleNamespace, rid: str) -> list[dict[str, Any]]:
    return [s for s in _spans(env) if s["attributes"].get("harvest.execution_id") == rid]


def test_a_decision_killed_before_its_commit_emitted_nothing_and_its_retake_emits_one(
    env: SimpleNamespace,
) -> None:
    """Worker A dies inside the start's decision (after its replay and write, before its commit):
    no decision span left; the retake, after the restart, emits one, so the run has as many
    decision spans as one that never crashed."""
    with workers_decide(env.app.harvest):  # worker A takes each first decision
        rid, trace_id, _ = _start(env, "trace_steps", 1)
    assert env.app.harvest.result(rid, timeout=60) == 1
    expected = len(_decisions(_closed_trace(env, rid, trace_id, "trace_steps")))
    crashed = f"trace_steps-{uuid.uuid4().hex[:8]}"
    env.redis.set(env.app.CRASH_KEY, crashed)
    with workers_decide(env.app.harvest):  # and dies in this one
        rid, trace_id, _ = _start(env, "trace_steps", 1, rid=crashed)
    wait_for(lambda: env.a.proc.poll() is not None, timeout=30, what="worker A to die in the decision")
    assert env.a.proc.returncode == 17 and not env.redis.exists(env.app.CRASH_KEY)
    assert _decisions(_trace(env, trace_id)) == []  # nothing left the process before the commit
    env.a.restart()
    assert env.app.harvest.result(rid, timeout=60) == 1
    assert len(_decisions(_closed_trace(env, rid, trace_id, "trace_steps"))) == expected


def test_a_post_cancel_decision_adds_no_span_and_no_sentry_event(env: SimpleNamespace) -> None:
    harvest = env.app.harvest
    with workers_decide(harvest):  # both decisions a worker's: their spans are the worker's
        rid, trace_id, _ = _start(env, "trace_wait", 1)
    wait_for(lambda: len(_decisions(_trace(env, trace_id))) == 2, timeout=30, what="two decisions")
    harvest.cancel_workflow_execution(rid, "no")
    with pytest.raises(WorkflowCancelledError):
        harvest.result(rid, timeout=30)
    wait_for(lambda: (harvest.store.cancel_branch(rid) or SimpleNamespace(settled=False)).settled, timeout=30)

    def decided() -> list[dict[str, Any]] | None:  # the post-cancel decision's Celery task span ended
        spans = _trace(env, trace_id)
        tasks = [s for s in spans if s["name"] == "run/harvest.decide"]
        return (
            spans if len(tasks) == 2 and any(s["name"] == "harvest.run trace_wait" for s in spans) else None
        )

    spans = wait_for(decided, timeout=30, what="the post-cancel decision's task span")
    assert len(_decisions(spans)) == 2
    (run,) = [s for s in spans if s["name"] == "harvest.run trace_wait"]
    assert run["attributes"]["harvest.status"] == "CANCELLED"
    assert _sentry(env, rid) == []


def test_a_child_and_continue_as_new_stay_in_the_trace(env: SimpleNamespace) -> None:
    parent_id, trace_id, _ = _start(env, "trace_parent", 2)
    assert env.app.harvest.result(parent_id, timeout=60) == 2
    loop_id, loop_trace, _ = _start(env, "trace_loop", 0)
    assert env.app.harvest.result(loop_id, timeout=60) == 3  # follows the chain
    child = wait_for(
        lambda: [s for s in _trace(env, trace_id) if s["name"] == "harvest.run trace_steps"],
        timeout=30,
        what="the child's run span",
    )
    (parent,) = wait_for(
        lambda: [s for s in _trace(env, trace_id) if s["name"] == "harvest.run trace_parent"],
        timeout=30,
        what="the parent's run span",
    )
    assert child[0]["parent"]["span_id"] == parent["context"]["span_id"]
    steps = wait_for(
        lambda: (
            [s for s in _trace(env, trace_id) if s["name"].startswith("harvest.activity trace_step")]
            if len([s for s in _trace(env, trace_id) if s["name"].startswith("harvest.activity trace_step")])
            == 2
            else None
        ),
        timeout=30,
        what="the child's two attempt spans",
    )
    by_id = {s["context"]["span_id"]: s for s in _trace(env, trace_id)}
    assert all(_under_run(s, child[0]["context"]["span_id"], by_id) for s in steps)
    runs = wait_for(
        lambda: (lambda r: r if len(r) == 3 else None)(
            [s for s in _trace(env, loop_trace) if s["name"] == "harvest.run trace_loop"]
        ),
        timeout=30,
        what="the chain's three run spans",
    )
    runs.sort(key=lambda s: s["start"])
    (start,) = [s for s in _trace(env, loop_trace) if s["name"] == "harvest.start"]
    assert all(r["parent"]["span_id"] == start["context"]["span_id"] for r in runs)  # flat
    assert [r["links"] for r in runs] == [[], [runs[0]["context"]], [runs[1]["context"]]]


def test_a_fork_and_a_schedule_tick_start_traces_of_their_own(env: SimpleNamespace) -> None:
    harvest = env.app.harvest
    rid, trace_id, _ = _start(env, "trace_steps", 2)
    assert harvest.result(rid, timeout=60) == 2
    (source,) = [
        s for s in _closed_trace(env, rid, trace_id, "trace_steps") if s["name"].startswith("harvest.run")
    ]
    fork_id = harvest.reset(rid, 1)  # from just after WorkflowStarted
    assert harvest.result(fork_id, timeout=60) == 2
    fork_trace = _stored(env, fork_id).traceparent.split("-")[1]
    assert fork_trace != trace_id
    fork_spans = _closed_trace(env, fork_id, fork_trace, "trace_steps")
    (fork,) = [s for s in fork_spans if s["name"] == "harvest.run trace_steps"]
    assert fork["parent"] is None and fork["links"] == [source["context"]]
    name = f"trace-tick-{uuid.uuid4().hex[:8]}"
    harvest.create_schedule(name, workflow="trace_steps", every=timedelta(seconds=1), input=1, max_runs=1)
    try:
        ((tick_id, _),) = wait_for(lambda: harvest.schedule_runs(name), timeout=30, what="the tick")
        assert harvest.result(tick_id, timeout=60) == 1
    finally:
        harvest.delete_schedule(name)
    tick_trace = _stored(env, tick_id).traceparent.split("-")[1]
    spans = _closed_trace(env, tick_id, tick_trace, "trace_steps")
    (start,) = [s for s in spans if s["name"] == "harvest.start"]
    (run,) = [s for s in spans if s["name"] == "harvest.run trace_steps"]
    assert start["parent"] is None and run["parent"]["span_id"] == start["context"]["span_id"]
    assert start["pid"] in (env.a.proc.pid, env.b.proc.pid)  # fired by a worker's sweeper


def _shape(span: dict[str, Any], by_id: dict[str, dict[str, Any]], run_id: str) -> list[Any]:
    """An attempt span's path up to the run span: each hop's kind, name (the activity's, or
    Celery's task name, which is the same on both paths) and attribute keys, up to the task span;
    above it, whether the task span reaches the run span (directly on the eager path, through the
    publish span of the message on the broker path)."""
    task = by_id[span["parent"]["span_id"]]
    return [
        (
            span["kind"],
            span["name"],
            sorted(span["attributes"]),
            span["events"] and span["events"][0]["name"],
        ),
        (task["kind"], task["name"], sorted(task["attributes"])),
        _reaches(task, run_id, by_id),
    ]


def test_eager_and_broker_attempts_give_the_same_tree_and_sentry_events(env: SimpleNamespace) -> None:
    """``trace_both``: ``trace_step`` and ``trace_fail_a`` once eager (on A) and once delivered
    (to B), each path one success and one failure."""
    order = {"id": 11, "note": env.app.MARKER}
    rid, trace_id, _ = _start(env, "trace_both", order)
    assert env.app.harvest.result(rid, timeout=60) == 5
    spans = _closed_trace(env, rid, trace_id, "trace_both")
    by_id = {s["context"]["span_id"]: s for s in spans}
    (run,) = [s for s in spans if s["name"] == "harvest.run trace_both"]
    attempts = [s for s in spans if s["name"].startswith("harvest.activity")]
    by_queue = {
        (s["name"], s["attributes"]["harvest.queue"]): _shape(s, by_id, run["context"]["span_id"])
        for s in attempts
    }
    assert len(attempts) == len(by_queue) == 4
    for name in ("harvest.activity trace_step", "harvest.activity trace_fail_a"):
        eager, broker = by_queue[(name, env.app.QUEUE_A)], by_queue[(name, env.app.QUEUE_B)]
        assert eager == broker, name
        assert eager[-1] is True
    for s in attempts:  # eager on A, delivered to B
        assert s["pid"] == (
            env.a.proc.pid if s["attributes"]["harvest.queue"] == env.app.QUEUE_A else env.b.proc.pid
        )
    events = wait_for(
        lambda: (lambda e: e if len(e) == 2 else None)(_sentry(env, rid)), timeout=30, what="2 events"
    )
    assert {e["pid"] for e in events} == {env.a.proc.pid, env.b.proc.pid}
    tags = [sorted(e["tags"]) for e in events]
    assert tags[0] == tags[1], tags
    assert all(e["tags"]["harvest.activity"] == "trace_fail_a" for e in events)
    assert env.app.MARKER not in json.dumps(spans) + json.dumps(events)


def test_a_workflow_failure_reaches_sentry_once_with_file_and_line(env: SimpleNamespace) -> None:
    """Reported by the worker that committed ``WorkflowFailed``; a replay and a query of the
    failed run, in a process whose Sentry is initialised too, report nothing."""
    harvest = env.app.harvest
    order = {"id": 12, "note": env.app.MARKER}
    rid = harvest.start_workflow("trace_wf_fail", order)
    with pytest.raises(WorkflowFailed):
        harvest.result(rid, timeout=60)
    (event,) = wait_for(lambda: _sentry(env, rid), timeout=30, what="the workflow's Sentry event")
    (exc,) = event["exception"]["values"]
    assert exc["type"] == "ValueError" and env.app.MARKER not in json.dumps(event)
    frame = exc["stacktrace"]["frames"][-1]
    assert frame["filename"].endswith("tracing_app.py") and frame["function"] == "trace_wf_fail"
    source = open(frame["abs_path"]).read().splitlines()[frame["lineno"] - 1]
    assert "raise ValueError" in source
    env.app.init_sentry()  # this process reports too now: a replay must not
    try:
        assert sentry.sdk() is not None
        replay_history(
            harvest.registry.workflow("trace_wf_fail"), rid, harvest.history(rid), harvest.registry
        )
        with pytest.raises(WorkflowFailed):
            harvest.result(rid, timeout=5)
    finally:
        env.app.close_sentry()
    assert sentry.sdk() is None
    assert len(_sentry(env, rid)) == 1
