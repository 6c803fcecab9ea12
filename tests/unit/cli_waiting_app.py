"""The ``--app`` of tests/unit/test_waiting_views.py: an embedded ``Harvest`` on the SQLite file
named by ``HARVEST_CLI_TEST_DB``, with a workflow limited to one admitted run per customer and a
workflow calling an activity limited to one body at once (its messages delivered by hand)."""

from __future__ import annotations

import os
from typing import Any

from harvest_celery import Harvest, WorkflowContext, activity, workflow

URL = "sqlite:///" + os.environ["HARVEST_CLI_TEST_DB"]


@workflow(name="wv_one", concurrency=1, limit_key=lambda i: i["customer"])
async def wv_one(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    return await ctx.wait_signal("go")


@activity(name="wv_charge", concurrency=1)
def wv_charge(data: dict[str, Any]) -> Any:
    return data


@workflow(name="wv_pay")
async def wv_pay(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    return await ctx.execute_activity(wv_charge, data)


harvest = Harvest(URL).register(wv_one, wv_charge, wv_pay)
