"""Activities under limits (``test_limits.py``), on the ``limited`` queue that two worker
processes of their own consume. Each body stamps its start and end (time, pid) in Redis under
the run's tag, so the test computes overlaps from the bodies' own clocks; a body asked to hold
blocks until the test raises its flag."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from harvest_celery import RetryPolicy, Saga, WorkflowContext, activity, workflow

from .app import r

QUEUE = "limited"


def stamp(data: dict[str, Any], what: str) -> None:
    r.rpush(
        f"stamps:{data['tag']}",
        json.dumps(
            {
                "what": what,
                "at": time.time(),
                "pid": os.getpid(),
                "label": data.get("label"),
                "key": data.get("key"),
            }
        ),
    )


def body(data: dict[str, Any]) -> str:
    stamp(data, "start")
    deadline = time.monotonic() + 60
    if data.get("hold"):
        while not r.exists(f"release:{data['tag']}") and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(data.get("sleep", 0.05))
    stamp(data, "end")
    return str(data.get("label"))


@activity(queue=QUEUE, concurrency=3)
def limited_three(data: dict[str, Any]) -> str:
    return body(data)


@activity(queue=QUEUE, concurrency=2, limit_key=lambda i: i["key"])
def limited_per_key(data: dict[str, Any]) -> str:
    return body(data)


@activity(queue=QUEUE, concurrency=1)
def limited_one(data: dict[str, Any]) -> str:
    return body(data)


@activity(queue=QUEUE, rate_limit="20/s")
def limited_rate(data: dict[str, Any]) -> str:
    return body(data)


@workflow
async def limited_call(ctx: WorkflowContext, data: dict[str, Any]) -> str:
    result: str = await ctx.execute_activity(data["activity"], data, priority=data.get("priority", 0))
    return result


@workflow
async def limited_pair(ctx: WorkflowContext, data: dict[str, Any]) -> str:
    """A step of ``limited_three``, then one of ``limited_one`` (or ``data["second"]``): the second is decided by the
    worker that completed the first (a process consuming the limited queue), so it may run
    there eagerly, if its slot is free in that very write."""
    await ctx.execute_activity(limited_three, {**data, "label": f"{data['label']}-first"})
    second = data.get("second", "limited_one")
    result: str = await ctx.execute_activity(second, {**data, "label": f"{data['label']}-second"})
    return result


@activity(queue=QUEUE, retry=RetryPolicy(max_attempts=1))
def fails_when_released(data: dict[str, Any]) -> str:
    body({**data, "hold": True})
    raise RuntimeError("declined")


@workflow
async def limited_saga(ctx: WorkflowContext, data: dict[str, Any]) -> str:
    """A forward step under ``limited_one`` whose compensation runs under the same limit, then
    a step that fails once the test releases it: the unwind's compensation waits for a slot."""
    saga = Saga(ctx)
    await saga.step(
        lambda: ctx.execute_activity(limited_one, {**data, "label": "saga-forward"}),
        lambda _r: ctx.execute_activity(limited_one, {**data, "label": "compensation"}),
    )
    try:
        result: str = await ctx.execute_activity(fails_when_released, {"tag": f"{data['tag']}-fail"})
    except Exception as exc:
        await saga.compensate_all_after(exc)
        raise
    return result


ALL = (
    limited_three,
    limited_per_key,
    limited_one,
    limited_rate,
    limited_call,
    limited_pair,
    fails_when_released,
    limited_saga,
)
