"""Activities under limits (``test_limits.py``), on the ``limited`` queue that two worker
processes of their own consume. Each body stamps its start and end (time, pid) in Redis under
the run's tag, so the test computes overlaps from the bodies' own clocks; a body asked to hold
blocks until the test raises its flag."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from harvest_celery import WorkflowContext, activity, workflow

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


@workflow
async def limited_call(ctx: WorkflowContext, data: dict[str, Any]) -> str:
    result: str = await ctx.execute_activity(data["activity"], data, priority=data.get("priority", 0))
    return result


ALL = (limited_three, limited_per_key, limited_one, limited_call)
