"""The Celery app the fault suite's workers run (``celery -A tests.faults.app``).

A 4-step saga (``fault_saga``): each step's forward activity records its effect in Postgres
(``fault_effects``) and its compensation records the undo there too, so an effect survives a
Redis restart and can be compared with the history. A run whose input says ``fail`` fails at its
last step (the suite sets it on every second run) and unwinds steps 3, 2, 1.

Fault hooks, all keyed by run id in Redis and each taken at most once per run (``SET NX``): the
test writes the point to hang at in ``hang:{run}``; the first process to reach it records
``{point}|{pid}`` in ``hung:{run}`` and waits until ``release:{run}`` exists (or 120 s), so the
test can kill that very process, restart a server under it, or let it go. Points:

* ``claim@{activity_id}``  inside the claim transaction, before ``ActivityStarted`` is appended
* ``start@{activity_id}``  claimed (``ActivityStarted`` committed), the body not begun
* ``mid@{activity_id}``    in the body, after its effect
* ``done@{activity_id}``   the body returned, its completion not yet recorded
* ``commit@{activity_id}`` inside the completion's transaction (before its inline decision)
* ``decide``               the workflow's first decision (inside the decision's transaction)
* ``unwind@{step}``        the workflow, mid-unwind, about to compensate ``step``

``faults:dup`` (an int in Redis) makes every process send each message that many times.

Timings: short ones for CI unless ``HARVEST_FAULTS_FULL=1`` (the library's defaults); see
``tests/faults/README.md``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import redis
import sqlalchemy as sa
from celery import Celery, current_task

from harvest_celery import RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest, configure_dedicated_celery_app
from harvest_celery._store.records import Timings

DATABASE_URL = os.environ.get(
    "HARVEST_FAULTS_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:25432/harvest_faults"
)
BROKER_URL = os.environ.get("HARVEST_FAULTS_BROKER_URL", "redis://127.0.0.1:26379/0")
FULL = os.environ.get("HARVEST_FAULTS_FULL") == "1"
QUEUE = "faults"

# CI: short timings so the suite fits its budget; FULL: the library's defaults.
TIMINGS = (
    Timings()
    if FULL
    else Timings(
        default_lease=3.0,
        redispatch_after=2.0,
        nd_retry_initial=0.5,
        nd_retry_max=2.0,
        outcome_retry_for=60.0,
    )
)
SWEEP_INTERVAL = 1.0 if FULL else 0.3
VISIBILITY_TIMEOUT = 3600 if FULL else 30

app = Celery("harvest_faults", broker=BROKER_URL)
configure_dedicated_celery_app(app)
app.conf.broker_transport_options = {"visibility_timeout": VISIBILITY_TIMEOUT}
if os.environ.get("HARVEST_FAULTS_QUEUE_TYPE") == "quorum":  # the app's own quorum defaults
    app.conf.update(task_default_queue_type="quorum", task_create_missing_queue_type="quorum")

harvest = Harvest(DATABASE_URL, app, timings=TIMINGS, sweep_interval=SWEEP_INTERVAL)

# the fault points and the forced-redelivery switch: a Redis that is never the broker on the
# RabbitMQ rows (HARVEST_FAULTS_REDIS_URL, test_rabbitmq.py)
REDIS_URL = os.environ.get("HARVEST_FAULTS_REDIS_URL") or BROKER_URL
r = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
_effects_engine: sa.Engine | None = None
_engine_lock = threading.Lock()

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS fault_effects (
    id bigserial PRIMARY KEY, run text NOT NULL, step int NOT NULL, kind text NOT NULL,
    activity_id text NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT now())
"""


def effects_engine() -> sa.Engine:
    global _effects_engine
    with _engine_lock:
        if _effects_engine is None or _effects_engine.url.database != sa.make_url(DATABASE_URL).database:
            _effects_engine = sa.create_engine(DATABASE_URL, pool_pre_ping=True, pool_size=4)
        return _effects_engine


# ── hooks ────────────────────────────────────────────────────────────────────────────────────
def hang_point(run: str, point: str) -> None:
    """Wait here if the test planned ``point`` for ``run`` and nobody took it yet. A Redis that
    does not answer plans nothing."""
    try:
        if r.get(f"hang:{run}") != point.encode():
            return
        if not r.set(f"hung:{run}", f"{point}|{os.getpid()}", nx=True):
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not r.exists(f"release:{run}"):
            time.sleep(0.05)
    except redis.RedisError:
        return


def _ids() -> tuple[str, str, int]:
    args = current_task.request.args if current_task else None
    if not args or len(args) != 3:
        raise RuntimeError("fault activities run as engine-dispatched Celery tasks only")
    return str(args[0]), str(args[1]), int(args[2])


def record_effect(step: int, kind: str) -> None:
    run, activity_id, attempt = _ids()
    with effects_engine().begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO fault_effects (run, step, kind, activity_id, attempt, pid) "
                "VALUES (:run, :step, :kind, :aid, :attempt, :pid)"
            ),
            {
                "run": run,
                "step": step,
                "kind": kind,
                "aid": activity_id,
                "attempt": attempt,
                "pid": os.getpid(),
            },
        )


class PlannedFailure(Exception):
    """The last step's failure on every second run: not retried."""


class CustomStop(BaseException):
    """A BaseException of the application's own."""


BASE_EXCEPTIONS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
    "CustomStop": CustomStop,
}


# ── the saga ─────────────────────────────────────────────────────────────────────────────────
def _forward(data: dict) -> str:
    run, activity_id, attempt = _ids()
    hang_point(run, f"start@{activity_id}")
    boom = data.get("boom")
    if boom and attempt == 1:
        raise BASE_EXCEPTIONS[boom](f"{boom} from the body of step {data['step']}")
    if data.get("fail"):
        raise PlannedFailure(f"step {data['step']} failed (planned)")  # before any effect
    record_effect(data["step"], "do")
    hang_point(run, f"mid@{activity_id}")
    return f"done-{data['step']}"


STEP_RETRY = RetryPolicy(
    max_attempts=6, initial_interval=0.2, maximum_interval=2.0, non_retryable_error_types=("PlannedFailure",)
)


@activity(queue=QUEUE, retry=STEP_RETRY)
def fault_step(data: dict) -> str:
    return _forward(data)


@activity(queue=QUEUE, retry=RetryPolicy(max_attempts=1))
def fault_step_once(data: dict) -> str:
    """The same step with no retry: an outcome it loses is never made good by another attempt."""
    return _forward(data)


@activity(queue=QUEUE, retry=STEP_RETRY)
def fault_undo(data: dict) -> str:
    record_effect(data["step"], "undo")  # idempotent in real life: undo by step id
    return f"undone-{data['step']}"


@workflow
async def fault_saga(ctx: WorkflowContext, data: dict) -> str:
    run = ctx.info.execution_id
    hang_point(run, "decide")
    saga = Saga(ctx)
    forward = fault_step_once if data.get("once") else fault_step

    def compensate(step: int) -> Any:
        hang_point(run, f"unwind@{step}")
        return ctx.execute_activity(fault_undo, {"step": step})

    for step in range(1, 5):
        step_input = {"step": step, "fail": bool(data.get("fail")) and step == 4}
        if data.get("boom_step") == step:
            step_input["boom"] = data["boom"]
        await saga.step(
            lambda step_input=step_input: ctx.execute_activity(forward, step_input),
            lambda _out, step=step: compensate(step),
        )
        if data.get("wf_boom") and step == 2:
            raise BASE_EXCEPTIONS[data["wf_boom"]](f"{data['wf_boom']} from workflow code")
    return "ok"


harvest.register(fault_step, fault_step_once, fault_undo, fault_saga)


# ── engine seams (test code: wrappers around the runtime's own methods) ──────────────────────
_completing = threading.local()


def _before_claim_append(execution_id: str, activity_id: str, attempt: int) -> None:
    if attempt == 1:
        hang_point(execution_id, f"claim@{activity_id}")


def _before_inline_decision(execution_id: str) -> None:
    claim = getattr(_completing, "claim", None)
    if claim is not None and claim.execution_id == execution_id:
        hang_point(execution_id, f"commit@{claim.activity_id}")


_original_complete = harvest.runtime.complete


def _complete(claim: Any, output: Any) -> None:
    hang_point(claim.execution_id, f"done@{claim.activity_id}")
    _completing.claim = claim
    try:
        _original_complete(claim, output)
    finally:
        _completing.claim = None


harvest.runtime.before_claim_append = _before_claim_append
harvest.runtime.before_inline_decision = _before_inline_decision
harvest.runtime.complete = _complete  # type: ignore[method-assign]

_original_send = harvest.runtime.dispatcher.send  # type: ignore[union-attr]


def _send(message: Any) -> None:
    """Forced redelivery: every message sent ``faults:dup`` times when the test asks."""
    try:
        copies = int(r.get("faults:dup") or 1)
    except redis.RedisError:
        copies = 1
    for _ in range(max(copies, 1)):
        _original_send(message)


harvest.runtime.dispatcher.send = _send  # type: ignore[union-attr,method-assign]
