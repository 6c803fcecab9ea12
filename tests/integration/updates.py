"""Workflows of the update tests (``test_updates.py``): a run that registers an update handler
with a validator, and parks on a signal. The handler awaits an activity and returns the new
total; the validator refuses anything but a positive int."""

from __future__ import annotations

from typing import Any

from harvest_celery import RetryPolicy, WorkflowContext, activity, workflow

from .app import record


@activity(name="up_double", queue="alpha", retry=RetryPolicy(max_attempts=1))
def up_double(data: dict) -> int:
    record(data["tag"], "double")
    return 2 * int(data["n"])


@activity(name="up_slow_double", queue="beta", retry=RetryPolicy(max_attempts=3))
def up_slow_double(data: dict) -> int:
    """On the other worker, slow enough to kill the decision worker while it runs."""
    import time

    time.sleep(float(data.get("sleep", 0)))
    record(data["tag"], "slow_double")
    return 2 * int(data["n"])


@workflow(name="up_counter")
async def up_counter(ctx: WorkflowContext, data: dict) -> int:
    state: dict[str, Any] = {"total": 0}

    def positive(arg: Any) -> None:
        if not isinstance(arg, int) or arg <= 0:
            raise ValueError(f"not a positive int: {arg!r}")

    async def add(arg: int) -> int:
        state["total"] += await ctx.execute_activity(up_double, {"tag": data["tag"], "n": arg})
        return int(state["total"])

    async def slow_add(arg: int) -> int:
        payload = {"tag": data["tag"], "n": arg, "sleep": data.get("sleep", 0)}
        state["total"] += await ctx.execute_activity(up_slow_double, payload)
        return int(state["total"])

    ctx.set_update_handler("add", add, validator=positive)
    ctx.set_update_handler("slow_add", slow_add, validator=positive)
    ctx.set_query_handler("total", lambda _arg: state["total"])
    await ctx.wait_signal("stop")
    return int(state["total"])


ALL = [up_double, up_slow_double, up_counter]
