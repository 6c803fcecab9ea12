"""The ``--app`` of tests/unit/test_cli_operator.py: an embedded ``Harvest`` on the SQLite file named
by ``HARVEST_CLI_TEST_DB`` with a workflow that waits for a signal and two small DAGs (one whose
middle node fails on its first run only, one that compensates)."""

from __future__ import annotations

import os
from typing import Any

from harvest_celery import DagBuilder, Harvest, RetryPolicy, WorkflowContext, activity, dag, workflow

URL = "sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"]
ONCE = RetryPolicy(max_attempts=1)
RAN: list[str] = []  # every body that ran, in order (fresh per import)


@activity(retry=ONCE)
def op_first(value: Any) -> dict:
    RAN.append("op_first")
    return {"node": "op_first"}


@activity(retry=ONCE)
def op_flaky(value: Any) -> dict:
    RAN.append("op_flaky")
    if RAN.count("op_flaky") == 1:
        raise RuntimeError("op_flaky failed the first time")
    return {"node": "op_flaky", "saw": value}


@activity(retry=ONCE)
def op_last(value: Any) -> str:
    RAN.append("op_last")
    return "done"


@activity(retry=ONCE)
def op_boom(value: Any) -> None:
    RAN.append("op_boom")
    raise RuntimeError("op_boom always fails")


@activity(retry=ONCE)
def op_undo(envelope: dict) -> str:
    RAN.append(f"undo:{envelope['dag_compensate']}")
    return "undone"


@dag
def op_retryable(g: DagBuilder) -> None:
    first = g.activity(op_first)
    flaky = g.activity(op_flaky).input_from(first)
    g.activity(op_last).input_from(flaky)


@dag
def op_compensating(g: DagBuilder) -> None:
    first = g.activity(op_first).compensate(op_undo)
    g.activity(op_boom).upstream(first)


@activity(retry=ONCE)
def op_echo(value: Any) -> Any:
    RAN.append("op_echo")
    return value


@workflow
async def op_gate(ctx: WorkflowContext, data: Any) -> str:
    first = await ctx.execute_activity(op_echo, data)
    decision = await ctx.wait_signal("go")
    return f"{first}:{decision}"


harvest = Harvest(URL)
harvest.register(
    op_first, op_flaky, op_last, op_boom, op_undo, op_echo, op_retryable, op_compensating, op_gate
)
