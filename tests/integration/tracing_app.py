"""A dedicated Celery app for the tracing tests (``celery -A tests.integration.tracing_app``).

Its own database, decision queue (``trace_decide``) and activity queues (``trace_a``,
``trace_b``), each name ending in ``HARVEST_TEST_DL_SUFFIX`` (the module's fixture sets one of
the session's own before the import; the workers inherit it): a stray worker of another run on
the same broker never takes them. Tracing is on, and every process that imports this module — the test process and
each worker — exports its finished spans to one Redis list (``SPANS_KEY``, on the suite's Redis,
never the broker) through ``RedisSpanExporter``, so the test reads one trace made by several
processes. ``opentelemetry-instrumentation-celery`` is active in the workers (its task spans
hang off the run span through the message headers); the test process instruments itself while
its fixture runs (``instrument``), as a web application would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import redis
import sentry_sdk
from celery import Celery
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

from harvest_celery import ActivityError, RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store import links
from harvest_celery._store.store import Timings
from tests.integration.brokers import apply_queue_type

BROKER_URL = os.environ["HARVEST_TEST_BROKER_URL"]
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
DATABASE_URL = os.environ["HARVEST_TEST_DATABASE_URL"] + "_trace"
SUFFIX = os.environ.get("HARVEST_TEST_DL_SUFFIX", "")
DECIDE, QUEUE_A, QUEUE_B = f"trace_decide{SUFFIX}", f"trace_a{SUFFIX}", f"trace_b{SUFFIX}"
SPANS_KEY = f"trace:spans{SUFFIX}"
SENTRY_KEY = f"trace:sentry{SUFFIX}"  # Sentry's events (``RedisTransport``)
CRASH_KEY = f"trace:crash{SUFFIX}"  # a run id: the worker deciding it dies before the commit
MARKER = "tr4ce-marker-91d2"  # in inputs and exception text: never in a span

_r = redis.Redis.from_url(REDIS_URL)


def _ctx(ctx: Any) -> dict[str, Any] | None:
    if ctx is None:
        return None
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


class RedisSpanExporter(SpanExporter):
    """Each finished span as one JSON object on ``SPANS_KEY`` (with the exporting pid)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            record = {
                "name": span.name,
                "context": _ctx(span.context),
                "parent": _ctx(span.parent),
                "kind": span.kind.name,
                "start": span.start_time,
                "end": span.end_time,
                "attributes": {k: v for k, v in (span.attributes or {}).items()},
                "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
                "links": [_ctx(link.context) for link in span.links],
                "status": span.status.description,
                "pid": os.getpid(),
            }
            _r.rpush(SPANS_KEY, json.dumps(record, default=str))
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(RedisSpanExporter()))

app = Celery("harvest_trace", broker=BROKER_URL)
apply_queue_type(app)
configure_dedicated_celery_app(app)
harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    sweep_interval=0.3,
    timings=Timings(redispatch_after=5.0),
    tracing=True,
    celery_error_detail="type",
)
harvest.tracing.provider = provider
ONCE = RetryPolicy(max_attempts=1)


def instrument() -> CeleryInstrumentor:
    instrumentor = CeleryInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    return instrumentor


class RedisTransport(Transport):
    """Each Sentry event as one JSON object on ``SENTRY_KEY`` (with the sending pid)."""

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type in ("event", "error"):
                event = json.loads(item.payload.get_bytes())
                _r.rpush(SENTRY_KEY, json.dumps({"pid": os.getpid(), **event}, default=str))


def close_sentry() -> None:
    """This process's client closed and unset: harvest sees no Sentry any more."""
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def init_sentry(*integrations: Any) -> None:
    """The real SDK with the capturing transport, as docs/observability.md sets it up."""
    sentry_sdk.init(
        dsn="http://key@127.0.0.1:9/1",
        transport=RedisTransport,
        integrations=list(integrations),
        default_integrations=False,
        include_local_variables=False,
    )


_after_decision = links.after_decision


def _dies_before_commit(tx: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
    """A decision of the run named on ``CRASH_KEY`` (once): the process dies inside the
    decision's transaction, after its replay and write, before its commit."""
    if _r.get(CRASH_KEY) == row.id.encode() and _r.delete(CRASH_KEY):
        os._exit(17)
    return _after_decision(tx, row, *args, **kwargs)


if os.environ.get("HARVEST_TEST_TRACE_WORKER"):  # a worker process: Celery's instrumentation on
    instrument()
    init_sentry(CeleryIntegration())  # and Sentry's Celery integration
    links.after_decision = _dies_before_commit


@activity(queue=QUEUE_A)
def trace_charge(order: dict[str, Any]) -> str:
    return f"ch-{order['id']}"


@activity(queue=QUEUE_B, retry=ONCE)
def trace_ship(order: dict[str, Any]) -> str:
    raise RuntimeError(f"cannot ship {order}")  # its input in the message


@activity(queue=QUEUE_A)
def trace_refund(charge_id: str) -> str:
    return f"refunded {charge_id}"


@activity(queue=QUEUE_A)
def trace_step(i: int) -> int:
    return i + 1


@activity(queue=QUEUE_B)
def trace_step_b(i: int) -> int:
    return i + 1


@activity(queue=QUEUE_A, retry=ONCE)
def trace_fail_a(order: dict[str, Any]) -> str:
    raise RuntimeError(f"cannot charge {order}")


@workflow
async def trace_eager_fail(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    """A step, then a failing step on the same queue: run eagerly on worker A."""
    await ctx.execute_activity(trace_step, 1)
    try:
        await ctx.execute_activity(trace_fail_a, order)
    except ActivityError:
        return "failed"
    return "ok"


@workflow
async def trace_saga(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(trace_charge, order), lambda c: ctx.execute_activity(trace_refund, c)
    )
    try:
        await ctx.execute_activity(trace_ship, order)
    except ActivityError:
        await saga.compensate_all()
        return "refunded"
    return "shipped"


@workflow
async def trace_steps(ctx: WorkflowContext, n: int) -> int:
    i = 0
    for k in range(n):
        i = await ctx.execute_activity(trace_step if k % 2 == 0 else trace_step_b, i)
    return i


@workflow
async def trace_wait(ctx: WorkflowContext, x: int) -> int:
    """One activity, a signal, one activity: four live decisions whatever the paths."""
    at = {"x": x}
    ctx.set_query_handler("at", lambda _arg: at["x"])
    at["x"] = await ctx.execute_activity(trace_step, x)
    await ctx.wait_signal("go")
    at["x"] = await ctx.execute_activity(trace_step_b, at["x"])
    return at["x"]


@workflow
async def trace_timer(ctx: WorkflowContext, x: int) -> int:
    x = await ctx.execute_activity(trace_step, x)
    await ctx.sleep(5)
    return await ctx.execute_activity(trace_step_b, x)


@workflow
async def trace_both(ctx: WorkflowContext, order: dict[str, Any]) -> int:
    """The same activities eager (``trace_a``: worker A decides, and runs them next) and
    delivered (``trace_b``: both scheduled by one decision of A's, so both go to worker B through
    the broker): one success and one failure on each path."""
    x = await ctx.execute_activity(trace_step, 1)
    try:
        await ctx.execute_activity(trace_fail_a, order)
    except ActivityError:
        x += 1
    step_b = ctx.execute_activity(trace_step, x, queue=QUEUE_B)
    fail_b = ctx.execute_activity(trace_fail_a, order, queue=QUEUE_B)
    x = await step_b
    try:
        await fail_b
    except ActivityError:
        x += 1
    return x


@workflow
async def trace_wf_fail(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    await ctx.execute_activity(trace_step, 1)
    raise ValueError(f"the workflow gives up on {order}")  # its input in the message


@workflow
async def trace_parent(ctx: WorkflowContext, n: int) -> int:
    return int(await ctx.execute_child_workflow(trace_steps, n))


@workflow
async def trace_loop(ctx: WorkflowContext, x: int) -> int:
    """One step per link, continued as new until 2: three runs in one chain."""
    x = await ctx.execute_activity(trace_step, x)
    if x < 3:
        ctx.continue_as_new(x)
    return x


harvest.register(
    trace_both,
    trace_wf_fail,
    trace_parent,
    trace_loop,
    trace_charge,
    trace_ship,
    trace_refund,
    trace_step,
    trace_step_b,
    trace_saga,
    trace_steps,
    trace_wait,
    trace_timer,
    trace_fail_a,
    trace_eager_fail,
)
