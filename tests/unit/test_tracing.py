"""Tracing on the embedded SQLite app, with the SDK's in-memory exporter (docs/observability.md,
"Tracing"; the real-worker tests are tests/integration/test_tracing.py): the switch and its
packaging, the span model, nothing from replays, probes and queries, no payload values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harvest_celery import (
    ActivityError,
    Harvest,
    RetryPolicy,
    Saga,
    WorkflowCancelledError,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._core.engine import replay_history
from harvest_celery._runtime import tracing
from harvest_celery._store.schema import executions

MARKER = "s3cr3t-marker-7f1c"
WAIT = 30.0


@activity
def charge(order):
    return f"ch-{order['id']}"


@activity
def ship(order):
    raise RuntimeError(f"cannot ship {order}")  # its input in the message


class _Diag:
    message_primary = "invalid input syntax for type json"


class _DriverError(Exception):
    diag = _Diag()


@activity
def bad_sql(order):
    try:
        raise _DriverError(f"LINE 1: ... VALUES ('{order}')")  # Postgres quotes the value back
    except _DriverError as exc:
        raise RuntimeError("the insert failed") from exc


@workflow
async def sql_fails(ctx: WorkflowContext, order):
    try:
        await ctx.execute_activity(bad_sql, order, retry=RetryPolicy(max_attempts=1))
    except ActivityError:
        return "failed"
    return "ok"


@activity
def refund(charge_id):
    return f"refunded {charge_id}"


@activity
def step(i):
    return i + 1


@workflow
async def checkout(ctx: WorkflowContext, order):
    saga = Saga(ctx)
    await saga.step(lambda: ctx.execute_activity(charge, order), lambda c: ctx.execute_activity(refund, c))
    try:
        await ctx.execute_activity(ship, order)
    except ActivityError:
        await saga.compensate_all()
        return "refunded"
    return "shipped"


@workflow
async def steps(ctx: WorkflowContext, n):
    i = 0
    ctx.set_query_handler("at", lambda _arg: i)
    for _ in range(n):
        i = await ctx.execute_activity(step, i)
    return i


@workflow
async def waiter(ctx: WorkflowContext, _):
    return await ctx.wait_signal("go")


@workflow
async def napper(ctx: WorkflowContext, _):
    await ctx.wait_signal("go")
    await ctx.sleep(0.2)
    return "woke"


@workflow
async def parent_flow(ctx: WorkflowContext, n):
    return await ctx.execute_child_workflow(steps, n)


@workflow
async def looper(ctx: WorkflowContext, n):
    await ctx.execute_activity(step, n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.provider = provider
    return exporter


def _app(tmp_path: Path, exporter: InMemorySpanExporter, **kw) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 't.db'}", tracing=True, **kw).register(
        charge, ship, refund, step, checkout, steps, waiter, napper, bad_sql, sql_fails, parent_flow, looper
    )
    h.migrate()
    h.tracing.provider = exporter.provider
    return h


def _request(exporter: InMemorySpanExporter):
    return exporter.provider.get_tracer("test").start_as_current_span("request")


def _by_id(finished):
    return {s.context.span_id: s for s in finished}


def _depth(span, by_id) -> int:
    depth = 1
    while span.parent is not None and span.parent.span_id in by_id:
        span, depth = by_id[span.parent.span_id], depth + 1
    return depth


def _stored_traceparent(h: Harvest, execution_id: str) -> str:
    with h.store.begin() as tx:
        return tx.conn.execute(
            sa.select(executions.c.traceparent).where(executions.c.id == execution_id)
        ).scalar_one()


# ── the switch ───────────────────────────────────────────────────────────────────────────────
def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_tracing_off_loads_no_opentelemetry_module(tmp_path):
    done = _python(
        f"""
        import json, sys
        import opentelemetry.trace  # installed here: the test is that harvest does not load it
        del sys.modules["opentelemetry.trace"]
        for name in [m for m in sys.modules if m.startswith("opentelemetry")]:
            del sys.modules[name]
        import harvest_celery
        h = harvest_celery.Harvest("sqlite:///{tmp_path / "off.db"}")
        from harvest_celery._runtime.metrics import METRICS
        loaded = [m for m in sys.modules if m.startswith(("opentelemetry", "sentry_sdk"))]
        print(json.dumps([h.tracing is None, h.runtime.tracer is None, METRICS.mirror is None, loaded]))
        """,
        HARVEST_TRACING="",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True, True, []]


def test_tracing_without_the_extra_names_it_and_writes_nothing(tmp_path):
    db = tmp_path / "none.db"
    done = _python(
        f"""
        import sys
        class NoOtel:  # opentelemetry not installed
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, NoOtel())
        import harvest_celery
        try:
            harvest_celery.Harvest("sqlite:///{db}", tracing=True)
        except ImportError as exc:
            print("ERROR", exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR" in done.stdout and "otel extra" in done.stdout
    assert "harvest-celery[otel]" in done.stdout
    assert not db.exists()


def test_harvest_tracing_env_switches_it_on(tmp_path, monkeypatch):
    monkeypatch.setenv("HARVEST_TRACING", "1")
    monkeypatch.setenv("HARVEST_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.delenv("HARVEST_BROKER_URL", raising=False)
    h = Harvest.from_env()
    assert isinstance(h.tracing, tracing.Tracing) and h.runtime.tracer is h.tracing
    monkeypatch.setenv("HARVEST_TRACING", "0")
    assert Harvest.from_env().tracing is None
    monkeypatch.setenv("HARVEST_TRACING", "maybe")
    with pytest.raises(ValueError, match="HARVEST_TRACING"):
        Harvest.from_env()


def test_with_tracing_on_the_metrics_are_also_otel_metrics(tmp_path, spans):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from harvest_celery._runtime import metrics

    h = _app(tmp_path, spans)
    reader = InMemoryMetricReader()
    h.tracing.metrics.provider = MeterProvider(metric_readers=[reader])
    labels = {"workflow": "steps", "queue": "default"}
    before = metrics.METRICS.value("activity_completed", labels)
    try:
        run_id = h.start_workflow("steps", 3)
        assert h.result(run_id, timeout=WAIT) == 3
        found = {
            m.name: m
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }
    finally:
        h.tracing.metrics.provider = None
    steps_ = [p for p in found["harvest_activity_completed"].data.data_points if dict(p.attributes) == labels]
    assert [p.value for p in steps_] == [3] == [metrics.METRICS.value("activity_completed", labels) - before]
    assert {p.attributes["path"] for p in found["harvest_decisions"].data.data_points} <= {
        "one_statement",
        "inline",
        "task",
    }
    lag = found["harvest_activity_schedule_to_start_seconds"]
    (point,) = lag.data.data_points
    assert lag.unit == "s" and dict(point.attributes) == {"queue": "default"} and point.count == 3
    assert tuple(point.explicit_bounds) == metrics.HISTOGRAMS["activity_schedule_to_start"]
    # the Prometheus names (without the suffixes the exposition adds), the limit gauges included
    assert (
        {name for _k, name, _d, _kind in metrics.specs()}
        >= set(found)
        >= {
            "harvest_activity_completed",
            "harvest_decisions",
            "harvest_activity_schedule_to_start_seconds",
        }
    )


# ── the span model ───────────────────────────────────────────────────────────────────────────
def test_traceparent_round_trip_and_the_derived_start_span():
    ctx = tracing.parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert ctx is not None and ctx.trace_flags.sampled
    assert tracing.traceparent(ctx) == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    start = tracing.start_span_of(ctx)
    assert start.trace_id == ctx.trace_id and start.span_id != ctx.span_id and start.span_id != 0
    for bad in (None, "", "01-x-y-z", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "00-zz-b7ad6b7169203331-01"):
        assert tracing.parse_traceparent(bad) is None


def test_the_saga_is_one_trace_under_the_request(tmp_path, spans):
    h = _app(tmp_path, spans)
    order = {"id": 7, "note": MARKER}
    with _request(spans) as request:
        run_id = h.start_workflow("checkout", order)
    assert h.result(run_id, timeout=WAIT) == "refunded"
    finished = spans.get_finished_spans()
    by_name = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)
    req = request.get_span_context()
    assert {s.context.trace_id for s in finished} == {req.trace_id}  # one trace
    (start,) = by_name["harvest.start"]
    assert start.parent.span_id == req.span_id
    (run,) = by_name["harvest.run checkout"]
    assert tracing.traceparent(run.context) == _stored_traceparent(h, run_id)  # the pre-allocated id
    assert run.parent.span_id == start.context.span_id
    with h.store.begin() as tx:
        created, closed = tx.conn.execute(
            sa.select(executions.c.created_at, executions.c.closed_at).where(executions.c.id == run_id)
        ).one()
    assert abs(run.start_time - tracing._ns(created)) < 1_000_000  # the run's own times
    assert abs(run.end_time - tracing._ns(closed)) < 1_000_000
    assert run.attributes["harvest.status"] == "COMPLETED"
    names = {s.name for s in finished}
    assert {"harvest.activity charge", "harvest.compensation refund"} <= names
    assert len(by_name["harvest.activity ship"]) == 3  # one span per attempt (3 by the default retry)
    decisions = [s for s in finished if s.name.startswith("harvest.decision ")]
    assert decisions
    for s in finished:
        if s.name.startswith(("harvest.decision", "harvest.activity", "harvest.compensation")):
            assert s.parent.span_id == run.context.span_id, s.name
    charged = by_name["harvest.activity charge"][0]
    assert dict(charged.attributes) == {
        "harvest.execution_id": run_id,
        "harvest.workflow": "checkout",
        "harvest.activity": "charge",
        "harvest.activity_id": charged.attributes["harvest.activity_id"],
        "harvest.attempt": 1,
        "harvest.queue": "default",
        "harvest.outcome": "completed",
    }
    assert {s.attributes["harvest.outcome"] for s in by_name["harvest.activity ship"]} == {"retry", "failed"}


def test_depth_does_not_grow_with_steps(tmp_path, spans):
    h = _app(tmp_path, spans)
    depths = {}
    for n in (2, 20):
        spans.clear()
        with _request(spans):
            run_id = h.start_workflow("steps", n)
        assert h.result(run_id, timeout=WAIT) == n
        finished = spans.get_finished_spans()
        assert len([s for s in finished if s.name == "harvest.activity step"]) == n
        by_id = _by_id(finished)
        depths[n] = max(_depth(s, by_id) for s in finished)
    assert depths[2] == depths[20] == 4  # request > start > run > step


def test_an_idempotent_retry_answers_the_first_runs_context(tmp_path, spans):
    h = _app(tmp_path, spans)
    with _request(spans):
        run_id = h.start_workflow("steps", 1, "order-1")
    first = _stored_traceparent(h, run_id)
    with _request(spans):  # another request, another trace: the first start's context stands
        assert h.start_workflow("steps", 1, "order-1") == run_id
    assert _stored_traceparent(h, run_id) == first
    starts = [s for s in spans.get_finished_spans() if s.name == "harvest.start"]
    assert [s.attributes["harvest.created"] for s in starts] == [True, False]


def test_a_run_started_with_tracing_off_is_not_traced(tmp_path, spans):
    off = Harvest(f"sqlite:///{tmp_path / 't.db'}").register(step, steps)
    off.migrate()
    run_id = off.start_workflow("steps", 2)
    h = _app(tmp_path, spans)
    assert h.result(run_id, timeout=WAIT) == 2
    assert _stored_traceparent(h, run_id) is None
    assert [s.name for s in spans.get_finished_spans()] == []


# ── replays, probes and queries emit nothing ─────────────────────────────────────────────────
def test_replays_probes_and_queries_add_no_span(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("steps", 3)
    assert h.result(run_id, timeout=WAIT) == 3
    count = len(spans.get_finished_spans())
    replay_history(h.registry.workflow("steps"), run_id, h.history(run_id), h.registry)  # a probe
    assert h.query(run_id, "at") == 3  # a query's replay
    assert len(spans.get_finished_spans()) == count


# ── no payload values ────────────────────────────────────────────────────────────────────────
def _texts(finished) -> list[str]:
    out = []
    for s in finished:
        out.append(s.name)
        out.extend(f"{k}={v}" for k, v in s.attributes.items())
        for e in s.events:
            out.append(e.name)
            out.extend(f"{k}={v}" for k, v in e.attributes.items())
    return out


def test_no_payload_value_under_type_detail(tmp_path, spans):
    h = _app(tmp_path, spans, celery_error_detail="type")
    run_id = h.start_workflow("checkout", {"id": 1, "note": MARKER})
    assert h.result(run_id, timeout=WAIT) == "refunded"
    finished = spans.get_finished_spans()
    assert not [t for t in _texts(finished) if MARKER in t]
    assert not [s for s in finished if MARKER in (s.status.description or "")]
    failed = [s for s in finished if s.name == "harvest.activity ship"][0]
    (event,) = failed.events
    assert event.name == "exception" and event.attributes["exception.type"] == "RuntimeError"


def test_under_full_detail_the_text_is_only_in_the_exception_event(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("checkout", {"id": 1, "note": MARKER})
    assert h.result(run_id, timeout=WAIT) == "refunded"
    finished = spans.get_finished_spans()
    for s in finished:
        assert MARKER not in s.name
        assert not [v for v in s.attributes.values() if MARKER in str(v)]
    events = [e for s in finished for e in s.events]
    assert events and all(MARKER in e.attributes["exception.message"] for e in events)


# ── after commit only ────────────────────────────────────────────────────────────────────────
def test_a_decision_that_does_not_commit_emits_nothing_and_its_retake_emits_one(tmp_path, spans, monkeypatch):
    from harvest_celery._store import links

    h = _app(tmp_path, spans)
    real, calls = links.after_decision, []

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the inline decision on the step's completion: it never commits
            raise RuntimeError("the decision dies before its commit")
        return real(*args, **kwargs)

    monkeypatch.setattr(links, "after_decision", second_fails)
    run_id = h.start_workflow("steps", 1)
    assert h.result(run_id, timeout=WAIT) == 1
    decisions = [s.name for s in spans.get_finished_spans() if s.name.startswith("harvest.decision")]
    assert decisions == ["harvest.decision task", "harvest.decision task"]  # the start's, the retake
    assert len(calls) == 3


def test_a_post_cancel_decision_emits_no_decision_span(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("waiter", None)
    wait_for_decisions = [s for s in spans.get_finished_spans() if s.name.startswith("harvest.decision")]
    assert len(wait_for_decisions) == 1  # the start's: it waits for the signal
    h.cancel_workflow_execution(run_id, "no")
    with pytest.raises(WorkflowCancelledError):
        h.result(run_id, timeout=WAIT)
    finished = spans.get_finished_spans()
    assert [s.name for s in finished if s.name.startswith("harvest.decision")] == ["harvest.decision task"]
    (run,) = [s for s in finished if s.name == "harvest.run waiter"]  # the close is traced
    assert run.attributes["harvest.status"] == "CANCELLED"


def test_timer_and_signal_waits_are_events_on_the_run_span(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("napper", MARKER)
    h.signal(run_id, "go", {"secret": MARKER})
    assert h.result(run_id, timeout=WAIT) == "woke"
    (run,) = [s for s in spans.get_finished_spans() if s.name == "harvest.run napper"]
    assert [e.name for e in run.events] == ["harvest.signal", "harvest.timer_started", "harvest.timer_fired"]
    assert run.events[0].attributes == {"harvest.signal": "go"}
    assert run.events[1].attributes["harvest.seconds"] == 0.2
    assert run.start_time <= run.events[0].timestamp <= run.events[2].timestamp <= run.end_time
    assert MARKER not in str([dict(e.attributes) for e in run.events])


def test_a_database_error_in_the_chain_stays_redacted_under_full_detail(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("sql_fails", MARKER)
    assert h.result(run_id, timeout=WAIT) == "failed"
    (span,) = [s for s in spans.get_finished_spans() if s.name == "harvest.activity bad_sql"]
    (event,) = span.events
    assert "invalid input syntax for type json" in event.attributes["exception.message"]
    assert "exception.stacktrace" not in event.attributes
    assert MARKER not in str(dict(event.attributes)) and MARKER not in (span.status.description or "")


def test_a_childs_run_span_is_a_child_of_its_parents(tmp_path, spans):
    h = _app(tmp_path, spans)
    with _request(spans) as request:
        run_id = h.start_workflow("parent_flow", 2)
    assert h.result(run_id, timeout=WAIT) == 2
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {request.get_span_context().trace_id}
    (parent,) = [s for s in finished if s.name == "harvest.run parent_flow"]
    (child,) = [s for s in finished if s.name == "harvest.run steps"]
    assert child.parent.span_id == parent.context.span_id
    steps_ = [s for s in finished if s.name == "harvest.activity step"]
    assert len(steps_) == 2 and all(s.parent.span_id == child.context.span_id for s in steps_)


def test_a_failing_exporter_or_context_read_never_fails_a_run(tmp_path, spans, monkeypatch):
    from opentelemetry.sdk.trace import SpanProcessor

    class Broken(SpanProcessor):
        def on_end(self, span):
            raise RuntimeError("the collector is down")

    h = _app(tmp_path, spans)
    h.tracing.provider.add_span_processor(Broken())
    run_id = h.start_workflow("steps", 2)
    assert h.result(run_id, timeout=WAIT) == 2
    monkeypatch.setattr(tracing.starts, "trace_context", lambda *_a: 1 / 0)
    h.tracing._known.clear()
    run_id = h.start_workflow("steps", 2)
    assert h.result(run_id, timeout=WAIT) == 2


def test_continue_as_new_keeps_the_trace_each_run_under_the_start_linked_to_the_last(tmp_path, spans):
    h = _app(tmp_path, spans)
    with _request(spans) as request:
        run_id = h.start_workflow("looper", 0)
    assert h.result(run_id, timeout=WAIT) == 2  # follows the chain
    finished = spans.get_finished_spans()
    assert {s.context.trace_id for s in finished} == {request.get_span_context().trace_id}
    (start,) = [s for s in finished if s.name == "harvest.start"]
    runs = sorted((s for s in finished if s.name == "harvest.run looper"), key=lambda s: s.start_time)
    assert len(runs) == 3
    assert all(r.parent.span_id == start.context.span_id for r in runs)  # flat: the start's children
    assert [len(r.links) for r in runs] == [0, 1, 1]
    assert runs[1].links[0].context.span_id == runs[0].context.span_id
    assert runs[2].links[0].context.span_id == runs[1].context.span_id


def test_a_reset_fork_starts_a_new_trace_linked_to_its_source(tmp_path, spans):
    h = _app(tmp_path, spans)
    run_id = h.start_workflow("steps", 2)
    assert h.result(run_id, timeout=WAIT) == 2
    fork_id = h.reset(run_id, 1)  # from just after WorkflowStarted
    assert h.result(fork_id, timeout=WAIT) == 2
    finished = spans.get_finished_spans()
    (source,) = [
        s
        for s in finished
        if s.name == "harvest.run steps" and s.attributes["harvest.execution_id"] == run_id
    ]
    (fork,) = [
        s
        for s in finished
        if s.name == "harvest.run steps" and s.attributes["harvest.execution_id"] == fork_id
    ]
    assert fork.context.trace_id != source.context.trace_id and fork.parent is None
    assert [link.context.span_id for link in fork.links] == [source.context.span_id]
    forked_steps = [
        s
        for s in finished
        if s.attributes.get("harvest.execution_id") == fork_id and s.name == "harvest.activity step"
    ]
    assert forked_steps and all(s.parent.span_id == fork.context.span_id for s in forked_steps)


def test_a_schedule_tick_starts_a_trace_of_its_own(tmp_path, spans):
    from datetime import timedelta

    h = _app(tmp_path, spans)
    h.create_schedule("tick", workflow="steps", every=timedelta(seconds=1), input=1, overlap="allow_all")
    fired: list[str] = []
    deadline = time.monotonic() + 10
    with _request(spans) as request:  # a span current in the firing process is not the tick's parent
        while not fired and time.monotonic() < deadline:
            fired = [run_id for f in h.fire_schedules() for run_id in f.fired]
            time.sleep(0.05)
    assert fired
    assert h.result(fired[0], timeout=WAIT) == 1
    finished = spans.get_finished_spans()
    ours = [s for s in finished if s.attributes.get("harvest.execution_id") == fired[0]]
    (start,) = [s for s in ours if s.name == "harvest.start"]
    (run,) = [s for s in ours if s.name == "harvest.run steps"]
    assert start.parent is None and run.parent.span_id == start.context.span_id
    assert run.context.trace_id != request.get_span_context().trace_id
    assert tracing.traceparent(run.context) == _stored_traceparent(h, fired[0])
