"""Workflows of the query tests (``test_queries.py``): a run that registers query handlers, takes
one step and parks on a signal. Its handlers read its state, change a local (which no decision
may ever see), echo their argument, and try to schedule an activity (which a query refuses)."""

from __future__ import annotations

from typing import Any

from harvest_celery import RetryPolicy, WorkflowContext, activity, workflow

from .app import record


@activity(name="qy_step", queue="alpha", retry=RetryPolicy(max_attempts=1))
def qy_step(data: dict) -> str:
    record(data["tag"], "step")
    return f"stepped {data['tag']}"


@workflow(name="qy_parked")
async def qy_parked(ctx: WorkflowContext, data: dict) -> str:
    state: dict[str, Any] = {"stage": "started", "peeked": 0}

    def peek(_arg: Any) -> int:
        state["peeked"] += 1  # a local a query changed: no decision may ever see it
        state["stage"] = "changed by a query"
        return int(state["peeked"])

    ctx.set_query_handler("stage", lambda _arg: dict(state))
    ctx.set_query_handler("peek", peek)
    ctx.set_query_handler("echo", lambda arg: {"arg": arg, "tag": data["tag"]})
    ctx.set_query_handler("schedules", lambda _arg: ctx.execute_activity(qy_step, data))
    first = await ctx.execute_activity(qy_step, data)
    state["stage"] = f"waiting ({first})"
    approval = await ctx.wait_signal("approve")
    state["stage"] = f"approved by {approval} after {state['peeked']} peeks"
    return str(state["stage"])


ALL = [qy_step, qy_parked]
