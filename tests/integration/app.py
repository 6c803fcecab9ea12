"""The Celery app the integration tests' worker processes run (``celery -A tests.integration.app``).

Activities record what they did in Redis (``effects:{tag}``) so a test can see which bodies ran,
how often, on which queue and which worker, without reaching into the worker process.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery, current_task

from harvest_celery import PostgresPayloadStore, RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store.store import Timings
from harvest_celery.examples import checkout, orders
from tests.integration.brokers import apply_queue_type

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker

app = Celery("harvest_it", broker=BROKER_URL)
configure_dedicated_celery_app(app)
apply_queue_type(app)  # HARVEST_TEST_QUEUE_TYPE=quorum: quorum defaults
app.conf.broker_transport_options = {"visibility_timeout": 3600}

# HARVEST_TEST_OFFLOAD=<bytes>: a worker restarted with it registers the Postgres payload store
# with that offload threshold (the cap-and-store tests)
OFFLOAD = int(os.environ.get("HARVEST_TEST_OFFLOAD") or 0)

harvest = Harvest(
    DATABASE_URL,
    app,
    max_activity_input_bytes=int(os.environ.get("HARVEST_TEST_CAP") or 2 * 1024 * 1024),
    payload_store=PostgresPayloadStore() if OFFLOAD else None,
    offload_threshold=OFFLOAD or 256 * 1024,
    timings=Timings(default_lease=30.0, redispatch_after=3.0, nd_retry_initial=0.5, nd_retry_max=2.0),
    sweep_interval=0.3,
    # HARVEST_TEST_FAST_PATHS=0: a worker restarted with it sends every step through the
    # decision task (the fast-paths comparison tests)
    fast_paths=os.environ.get("HARVEST_TEST_FAST_PATHS") != "0",
    # HARVEST_TEST_STICKY_EXPIRES=<seconds>: the sticky queue's x-expires (test_rabbitmq.py)
    sticky_queue_expires=float(os.environ.get("HARVEST_TEST_STICKY_EXPIRES") or 300),
)

# HARVEST_TEST_COLD=1: a worker restarted with it keeps no warm replay, so every decision it takes
# replays the run's whole history cold
if os.environ.get("HARVEST_TEST_COLD"):
    harvest.runtime.settings.sticky_sessions = False

r = redis.Redis.from_url(REDIS_URL)


def record(tag: str, name: str, value: Any = None) -> None:
    request = current_task.request if current_task else None
    delivery = (getattr(request, "delivery_info", None) or {}) if request else {}
    r.rpush(
        f"effects:{tag}",
        json.dumps(
            {
                "name": name,
                "value": value,
                "queue": delivery.get("routing_key"),
                "eager": bool(delivery.get("harvest_eager")),
                "worker": getattr(request, "hostname", None) if request else None,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
        ),
    )


@activity(queue="alpha")
def step_one(data: dict) -> dict:
    record(data["tag"], "step_one", data)
    return {**data, "one": True}


@activity(queue="beta")
def step_two(data: dict) -> dict:
    record(data["tag"], "step_two", data)
    return {**data, "two": True}


@activity(queue="alpha")
def step_three(data: dict) -> str:
    record(data["tag"], "step_three", data)
    return f"done:{data['tag']}"


@workflow
async def three_steps(ctx: WorkflowContext, data: dict) -> str:
    one = await ctx.execute_activity(step_one, data)
    two = await ctx.execute_activity(step_two, one)
    return await ctx.execute_activity(step_three, two)  # type: ignore[no-any-return]


@activity(queue="alpha")
def alpha_step(data: dict) -> int:
    record(data["tag"], "alpha_step", data["i"])
    return int(data["i"]) + 1


@activity(queue="alpha", start_to_close=20)
def alpha_deadline(data: dict) -> int:
    record(data["tag"], "alpha_deadline", data["i"])
    return int(data["i"]) + 1


@workflow
async def alpha_chain(ctx: WorkflowContext, data: dict) -> int:
    step = alpha_deadline if data.get("deadline") else alpha_step
    i = 0
    for _ in range(data["n"]):
        i = await ctx.execute_activity(step, {"tag": data["tag"], "i": i})
    return i


@activity(queue="beta", start_to_close=4, retry=RetryPolicy(max_attempts=3, initial_interval=0.2))
def slow_until_released(data: dict) -> str:
    """Blocks until the test releases it (or a later attempt runs), so a test can kill -9 the
    worker mid-body."""
    record(data["tag"], "slow_started", data)
    attempt_key = f"attempts:{data['tag']}"
    attempt = r.incr(attempt_key)
    if attempt == 1:
        time.sleep(60)  # the first attempt is the one the test kills
    record(data["tag"], "slow_finished", attempt)
    return f"finished on attempt body {attempt}"


@workflow
async def survives_kill(ctx: WorkflowContext, data: dict) -> str:
    out = await ctx.execute_activity(slow_until_released, data)
    await ctx.execute_activity(step_three, data)
    return out  # type: ignore[no-any-return]


@activity(queue="alpha", retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
def flaky(data: dict) -> str:
    n = r.incr(f"flaky:{data['tag']}")
    record(data["tag"], "flaky", n)
    if n < data.get("succeed_on", 2):
        raise ConnectionError(f"flaky attempt {n}")
    return f"ok after {n}"


@activity(queue="alpha", retry=RetryPolicy(max_attempts=5, non_retryable_error_types=("ValueError",)))
def rejects(data: dict) -> str:
    record(data["tag"], "rejects", None)
    raise ValueError("bad order")


@workflow
async def retrying(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.execute_activity(flaky, data)  # type: ignore[no-any-return]


@workflow
async def non_retryable(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.execute_activity(rejects, data)  # type: ignore[no-any-return]


@workflow
async def deployable(ctx: WorkflowContext, data: dict) -> str:
    """Its code 'version' is the worker's DEPLOYED_VERSION: the test restarts the decision worker
    with version 2 (a deploy that reorders the first two activities), then rolls it back."""
    version = os.environ.get("DEPLOYED_VERSION", "1")
    first, second = (step_one, step_two) if version == "1" else (step_two, step_one)
    await ctx.execute_activity(first, data)
    await ctx.execute_activity(second, data)
    await ctx.wait_signal("go")
    return await ctx.execute_activity(step_three, data)  # type: ignore[no-any-return]


@workflow
async def fan_out(ctx: WorkflowContext, data: dict) -> list:
    items = [dict(data, i=i) for i in range(data["n"])]
    return await ctx.gather(*(ctx.execute_activity(step_one, item) for item in items))


@workflow
async def sleeper(ctx: WorkflowContext, data: dict) -> str:
    await ctx.sleep(data.get("seconds", 0.5))
    return await ctx.execute_activity(step_three, data)  # type: ignore[no-any-return]


# ── sagas ────────────────────────────────────────────────────────────────────────────────────
@activity(queue="alpha", retry=RetryPolicy(max_attempts=1))
def forward(data: dict) -> str:
    record(data["tag"], f"forward:{data['step']}", data)
    if data.get("slow"):
        time.sleep(data["slow"])
    if data.get("fail"):
        raise RuntimeError(f"forward {data['step']} failed")
    return f"fwd-{data['step']}"


@activity(queue="beta", retry=RetryPolicy(max_attempts=1))
def undo(data: dict) -> str:
    record(data["tag"], f"undo:{data['step']}", data)
    if data.get("fail"):
        raise RuntimeError(f"undo {data['step']} failed")
    if data.get("slow"):
        time.sleep(data["slow"])
    return f"undone-{data['step']}"


@workflow
async def saga_steps(ctx: WorkflowContext, data: dict) -> str:
    """Steps 1..n forward; step ``fail_at`` fails; compensations listed in ``undo_fails`` fail."""
    saga = Saga(ctx)
    tag = data["tag"]

    def compensation(step: int) -> Any:
        # Test probe (an anti-pattern in real code): counts how often the closure is invoked,
        # which replays do on every decision.
        r.incr(f"closure:{tag}:{step}")
        return ctx.execute_activity(
            undo,
            {
                "tag": tag,
                "step": step,
                "fail": step in data.get("undo_fails", []),
                "slow": data.get("undo_slow", 0),
            },
        )

    for step in range(1, data["n"] + 1):
        await saga.step(
            lambda step=step: ctx.execute_activity(
                forward,
                {
                    "tag": tag,
                    "step": step,
                    "fail": step == data.get("fail_at"),
                    "slow": data.get("slow", 0) if step == data.get("slow_at") else 0,
                },
            ),
            lambda _out, step=step: compensation(step),
        )
    if data.get("check_cancel", True) and ctx.is_cancelled():
        await saga.compensate_all()
    return "ok"


@workflow
async def cancel_and_compensate(ctx: WorkflowContext, data: dict) -> str:
    """The recommended pattern with in-memory compensations (they run fine after a cancel)."""
    saga = Saga(ctx)
    undone: list[str] = []
    await saga.step(
        lambda: ctx.execute_activity(forward, {"tag": data["tag"], "step": 1}), lambda out: undone.append(out)
    )
    # the cancel lands while this body runs; it keeps its claim and its result is recorded
    await ctx.execute_activity(forward, {"tag": data["tag"], "step": 2, "slow": data.get("slow", 2)})
    if ctx.is_cancelled():
        await saga.compensate_all()
        return f"compensated {undone}"
    return "not cancelled"


harvest.register(
    orders,
    checkout,
    step_one,
    step_two,
    step_three,
    three_steps,
    alpha_step,
    alpha_deadline,
    alpha_chain,
    slow_until_released,
    survives_kill,
    flaky,
    rejects,
    retrying,
    non_retryable,
    deployable,
    fan_out,
    sleeper,
    forward,
    undo,
    saga_steps,
    cancel_and_compensate,
)


def _inject_claim_failure(execution_id: str, activity_id: str, attempt: int) -> None:
    """Fault injection for the claim test: fail the claim transaction before ActivityStarted is
    appended, as many times as ``fail_claim:{execution_id}`` says."""
    if r.decr(f"fail_claim:{execution_id}") >= 0:
        r.incr(f"claim_failures:{execution_id}")
        raise RuntimeError("injected claim failure")
    r.delete(f"fail_claim:{execution_id}")


harvest.runtime.before_claim_append = _inject_claim_failure


# ── an existing Celery task adopted as an activity by name ────────────────────────────────────
@app.task(name="legacy.send_email")
def send_email(payload: dict) -> str:
    """A task that predates harvest: it takes its input as an ordinary argument."""
    record(payload["tag"], "send_email", payload)
    return f"sent to {payload['to']}"


harvest.adopt_task("legacy.send_email", queue="beta")


@workflow
async def notify(ctx: WorkflowContext, data: dict) -> str:
    await ctx.execute_activity(step_one, data)
    return await ctx.execute_activity("legacy.send_email", {"tag": data["tag"], "to": data["to"]})  # type: ignore[no-any-return]


@workflow
async def approval(ctx: WorkflowContext, data: dict) -> str:
    decision = await ctx.wait_signal("decision")
    return f"{data['tag']}:{decision}"


@workflow
async def offload_then_wait(ctx: WorkflowContext, data: dict) -> str:
    """step_one's input and output are offloaded by a worker with a store (HARVEST_TEST_OFFLOAD);
    the run then waits for a signal, so the test can take the store away."""
    await ctx.execute_activity(step_one, data)
    await ctx.wait_signal("go")
    return await ctx.execute_activity(step_three, {"tag": data["tag"]})  # type: ignore[no-any-return]


harvest.register(notify, approval, offload_then_wait)


from . import dags  # noqa: E402  (the DAG fixtures need record() from this module)

harvest.register(*dags.ACTIVITIES, *dags.DAGS)


# ── a queue no test worker consumes (the stuck-run hint) ──────────────────────────────────────
@activity(queue="nobody_listens")
def unheard(data: dict) -> str:
    record(data["tag"], "unheard", data)
    return "heard after all"


@workflow
async def waits_on_nobody(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.execute_activity(unheard, data)  # type: ignore[no-any-return]


harvest.register(unheard, waits_on_nobody)


# ── the cancellation tests' workflows, activities and DAGs (test_cancel.py) ──────────────────
from . import cancels  # noqa: E402  (they need record() and r from this module)

harvest.register(*cancels.ALL)

# ── child workflows and continue-as-new (test_children.py) ───────────────────────────────────
from . import children  # noqa: E402  (they need record() from this module)

harvest.register(*children.ALL)

# HARVEST_TEST_DIE_BEFORE_NOTICE=1: a worker restarted with it kills itself (SIGKILL) right after
# a child's close commits, before its notice is applied (the sweeper's case)
if os.environ.get("HARVEST_TEST_DIE_BEFORE_NOTICE"):
    import signal as _signal

    harvest.runtime.before_child_notices = lambda _ids: os.kill(os.getpid(), _signal.SIGKILL)


# ── the console's browser test (test_console.py): an activity error that holds markup ─────────
XSS_MESSAGE = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


@activity(queue="alpha", retry=RetryPolicy(max_attempts=2, initial_interval=0.2))
def console_xss(data: dict) -> str:
    record(data["tag"], "console_xss", data)
    raise ValueError(XSS_MESSAGE)


@workflow
async def console_probe(ctx: WorkflowContext, data: dict) -> str:
    """Runs ``console_xss``, which always fails: the run fails with a markup-laden error."""
    return await ctx.execute_activity(console_xss, data)  # type: ignore[no-any-return]


harvest.register(console_xss, console_probe)


# ── the activity limits' tests (test_limits.py): their own queue and worker processes ────────
from . import limited  # noqa: E402  (they need r from this module)

harvest.register(*limited.ALL)


@app.task(name="legacy.limited_send")
def limited_send(data: dict) -> str:
    """An existing Celery task, adopted with a limit: limited when harvest dispatches it."""
    return limited.body(data)


harvest.adopt_task("legacy.limited_send", queue=limited.QUEUE, concurrency=1)


# ── the query tests (test_queries.py) ────────────────────────────────────────────────────────
from . import queries  # noqa: E402  (they need record() from this module)

harvest.register(*queries.ALL)

# ── the update tests (test_updates.py) ───────────────────────────────────────────────────────
from . import updates  # noqa: E402  (they need record() from this module)

harvest.register(*updates.ALL)
