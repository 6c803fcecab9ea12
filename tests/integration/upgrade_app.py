"""The app of the rolling-upgrade test (test_upgrade.py), importable by the current package AND
by the build that was deployed before the restructure (``DEPLOYED`` in test_upgrade.py): it uses
only names both builds have. Its own database (``HARVEST_UPGRADE_DATABASE_URL``) and its own
queues (``up_*``), so the session's other workers, on the same Redis, never take its messages.

``up_order``: a saga step (charge, refunded by ``up_refund`` on failure), a signal, a second
step (``up_ship``, which fails when the input asks). ``data["first_queue"]`` routes the charge
to another queue, so a test can leave it undelivered."""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery

import harvest_celery._store as _store_layout
from harvest_celery import RetryPolicy, Saga, WorkflowContext, activity, workflow
from harvest_celery._client import Harvest

try:  # the current name
    from harvest_celery._client import configure_dedicated_celery_app
except ImportError:  # the deployed build: configure_celery
    from harvest_celery._client import configure_celery as configure_dedicated_celery_app

try:  # the current layout
    from harvest_celery._store.store import Timings
except ImportError:  # the deployed build: one flat _store module
    from harvest_celery._store import Timings  # type: ignore[attr-defined,no-redef]

DATABASE_URL = os.environ["HARVEST_UPGRADE_DATABASE_URL"]
BROKER_URL = os.environ["HARVEST_TEST_BROKER_URL"]
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")  # never the broker
# which build imported this: the deployed one has a flat ``_store`` module, this one a package
BUILD = "new" if hasattr(_store_layout, "__path__") else "old"
DECIDE = "up_decide"
QUEUES = f"{DECIDE},up_a,up_b"
ONCE = RetryPolicy(max_attempts=1)

app = Celery("harvest_upgrade", broker=BROKER_URL)
configure_dedicated_celery_app(app)
app.conf.broker_transport_options = {"visibility_timeout": 3600}
harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    sweep_interval=0.3,
    timings=Timings(default_lease=30.0, redispatch_after=2.0, nd_retry_initial=0.5, nd_retry_max=2.0),
)
harvest.runtime.settings.relay_after = 1.0  # an older build's unsent outbox rows: relayed soon
r = redis.Redis.from_url(REDIS_URL)


def record(data: dict, name: str) -> None:
    """Which body ran, for which run, in which build (``upgrade:{tag}`` in Redis)."""
    r.rpush(f"upgrade:{data['tag']}", json.dumps({"name": name, "run": data["run"], "build": BUILD}))


@activity(queue="up_a", retry=ONCE)
def up_charge(data: dict) -> dict:
    record(data, "up_charge")
    return {"charge": f"ch-{data['run']}"}


@activity(queue="up_a", retry=ONCE)
def up_refund(charge: dict) -> str:
    tag, run = charge["tag"], charge["run"]
    record({"tag": tag, "run": run}, "up_refund")
    return f"refunded {charge['charge']}"


@activity(queue="up_b", retry=ONCE)
def up_ship(data: dict) -> str:
    record(data, "up_ship")
    if data.get("fail"):
        raise RuntimeError(f"no courier for {data['run']}")
    return f"shipped {data['run']}"


@workflow
async def up_order(ctx: WorkflowContext, data: dict) -> Any:
    saga = Saga(ctx)
    charge = await saga.step(
        lambda: ctx.execute_activity(up_charge, data, queue=data.get("first_queue", "")),
        lambda c: ctx.execute_activity(up_refund, {**c, "tag": data["tag"], "run": data["run"]}),
    )
    go = await ctx.wait_signal("go")
    shipped = await saga.step(
        lambda: ctx.execute_activity(up_ship, {**data, **go}),
        lambda _s: ctx.execute_activity(up_refund, {**charge, "tag": data["tag"], "run": data["run"]}),
    )
    return {"charge": charge["charge"], "shipped": shipped}


harvest.register(up_order, up_charge, up_refund, up_ship)
