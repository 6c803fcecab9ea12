"""Message priority on real workers (``test_message_priority.py``): an activity on the ``beta``
queue records the ``priority`` its message carried, as the worker received it (Celery's
``request.delivery_info``, read from the message's properties)."""

from __future__ import annotations

import json
from typing import Any

from celery import current_task

from harvest_celery import WorkflowContext, activity, workflow

from .app import r


@activity(queue="beta")  # w2 consumes it and w1 decides, so its message is always sent
def priority_probe(data: dict[str, Any]) -> None:
    delivery = current_task.request.delivery_info or {}
    r.rpush(
        f"priorities:{data['tag']}",
        json.dumps({"label": data["label"], "priority": delivery.get("priority")}),
    )


@workflow
async def priority_call(ctx: WorkflowContext, data: dict[str, Any]) -> None:
    await ctx.execute_activity(priority_probe, data, priority=data["priority"])


ALL = (priority_probe, priority_call)
