"""The worker app of tests/integration/test_admission.py: a limited workflow (at most one
admitted run per customer) on decision and activity queues of its own, which two worker
processes consume, with short timings (a 0.3 s sweep, a short lease for the kill -9 test).

The queue names end in ``HARVEST_TEST_ADM_SUFFIX``, set by the module's fixture before it
imports this module (the workers inherit it), as ``deadlines_app`` does: no worker of another
run on the same broker can take this run's decision requests. Each body stamps its start and
end (time, pid, label) in Redis under the run's customer, so the test reads lifetimes from the
bodies' own clocks; a body asked to hold blocks until the test raises its flag. A run started
with ``nd`` diverges from its history once the test sets ``nd:<label>`` (nd-blocked), and one
started with ``links=n`` continues as new n times. ``adm_parent`` starts children of it (and
one of ``adm_bad_key``, whose key raises); ``adm_dag`` is a DAG limited the same way, for
``retry_dag_run``. ``adm_global`` has one global limit of 1."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import redis
from celery import Celery

from harvest_celery import (
    DagBuilder,
    Harvest,
    InvalidLimitKey,
    RetryPolicy,
    Timings,
    WorkflowContext,
    activity,
    dag,
    workflow,
)
from harvest_celery._client import configure_dedicated_celery_app
from harvest_celery._core.admission import declare_admission

DATABASE_URL = os.environ.get(
    "HARVEST_TEST_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/harvest_it"
)
BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
REDIS_URL = os.environ.get("HARVEST_TEST_REDIS_URL", "redis://127.0.0.1:6379/5")
SUFFIX = os.environ.get("HARVEST_TEST_ADM_SUFFIX", "")
DECIDE, QUEUE = f"adm_decide{SUFFIX}", f"adm_q{SUFFIX}"

app = Celery("harvest_adm", broker=BROKER_URL)
configure_dedicated_celery_app(app)
harvest = Harvest(
    DATABASE_URL,
    app,
    decision_queue=DECIDE,
    timings=Timings(default_lease=2.0, redispatch_after=3.0),
    sweep_interval=0.3,
)
r = redis.Redis.from_url(REDIS_URL)


def stamp(data: dict[str, Any], what: str) -> None:
    r.rpush(
        f"adm:{data['customer']}",
        json.dumps({"what": what, "at": time.time(), "pid": os.getpid(), "label": data["label"]}),
    )


@activity(queue=QUEUE, retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
def adm_body(data: dict[str, Any]) -> int:
    """The run's first activity: its start stamp opens the run's lifetime (its close ends it)."""
    stamp(data, "start")
    deadline = time.monotonic() + 120
    if data.get("hold"):
        while not r.exists(f"release:{data['label']}") and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(data.get("sleep", 0.02))
    stamp(data, "end")
    return os.getpid()


@activity(queue=QUEUE)
def adm_other(data: dict[str, Any]) -> int:
    """What a diverged replay asks for instead of ``adm_body`` (it is never dispatched)."""
    return os.getpid()


@workflow(name="adm_customer", concurrency=1, limit_key=lambda i: i["customer"])
async def adm_customer(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    if data.get("nd") and r.exists(f"nd:{data['label']}"):  # the test's flag: a diverged replay
        await ctx.execute_activity(adm_other, data)
    link = data.get("link", 0)  # a chain of ``links`` continue-as-new links after this run
    body = {**data, "label": f"{data['label']}-l{link}"} if link else data
    pid = await ctx.execute_activity(adm_body, body)
    if link < data.get("links", 0):
        ctx.continue_as_new({**data, "link": link + 1})
    if data.get("wait_signal"):
        return {"signal": await ctx.wait_signal("go"), "pid": pid}
    return {"label": data["label"], "pid": pid, "priority": ctx.info.priority}


@workflow(name="adm_bad_key", concurrency=1, limit_key=lambda i: i["missing"])
async def adm_bad_key(ctx: WorkflowContext, data: Any) -> Any:
    return data  # never started: its key raises at the parent's decision


@workflow(name="adm_parent")
async def adm_parent(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    """Starts a child whose key raises (``InvalidLimitKey`` into this code, nothing recorded),
    then children of ``adm_customer`` for one customer, which wait for admission in order."""
    errors = []
    try:
        ctx.start_child_workflow(adm_bad_key, {"x": 1})
    except InvalidLimitKey as exc:
        errors.append([type(exc).__name__, str(exc)])
    kids = [
        ctx.start_child_workflow(adm_customer, {"customer": data["customer"], "label": label}, id=label)
        for label in data["labels"]
    ]
    return {"errors": errors, "kids": [(await kid)["label"] for kid in kids]}


@activity(queue=QUEUE, retry=RetryPolicy(max_attempts=1))
def adm_dag_step(envelope: dict[str, Any]) -> int:
    """``adm_dag``'s one node: stamps like ``adm_body`` (held while asked); fails while the
    test's ``fail:<label>`` flag is set (a failed run, for ``retry_dag_run``)."""
    conf = envelope["conf"]
    pid = adm_body(conf)
    if r.exists(f"fail:{conf['label']}"):
        raise RuntimeError("failed by the test's flag")
    return pid


@dag(name="adm_dag")
def adm_dag(g: DagBuilder) -> None:
    g.activity(adm_dag_step)


# ``@dag`` takes no ``concurrency=`` (only ``@workflow`` does): the definition is given one as
# ``@workflow(concurrency=1, limit_key=...)`` would, so a DAG retry of a limited run can be shown
adm_dag.__harvest_workflow__ = dataclasses.replace(  # type: ignore[attr-defined]
    adm_dag.__harvest_workflow__,  # type: ignore[attr-defined]
    admission=declare_admission(1, lambda conf: conf["customer"]),
)


@workflow(name="adm_global", concurrency=1)
async def adm_global(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
    """One global limit (no ``limit_key``): its own limit row is the one every start settles."""
    return {"label": data["label"], "pid": await ctx.execute_activity(adm_body, data)}


harvest.register(
    adm_body, adm_other, adm_customer, adm_bad_key, adm_parent, adm_dag_step, adm_dag, adm_global
)
__all__ = ["DECIDE", "QUEUE", "app", "harvest"]
