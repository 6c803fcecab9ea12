"""The sticky cache (a replay kept warm between decisions) must be indistinguishable from a full
replay at every decision: the same scenarios run both ways give identical histories and metrics."""

from __future__ import annotations

import random

import pytest

from harvest_celery import Saga, WorkflowContext, activity, workflow
from harvest_celery.examples import checkout, fulfillment, orders
from harvest_celery.testing import Simulator


@activity
def step(x):
    return x


@activity
def flaky_undo(x):
    raise RuntimeError(f"undo {x} failed")


@workflow
async def mixed(ctx: WorkflowContext, data: dict) -> list:
    saga = Saga(ctx)
    first = await saga.step(
        lambda: ctx.execute_activity(step, "a"), lambda v: ctx.execute_activity(step, f"undo-{v}")
    )
    pair = await ctx.gather(ctx.execute_activity(step, "b"), ctx.execute_activity(step, "c"))
    if ctx.patched("v2"):
        await ctx.sleep(5)
    got = await ctx.wait_signal("go")
    saga.push_compensation(lambda: ctx.execute_activity(flaky_undo, "x"))
    if got == "unwind":
        try:
            await saga.compensate_all()
        except Exception:  # noqa: BLE001 - the author catches it; the counter still fires
            pass
        saga.push_compensation(lambda: ctx.execute_activity(step, "second"))
        await saga.compensate_all()
    return [first, *pair, ctx.random() < 2]


def drive(sim: Simulator, workflow_type: str, data, seed: int):
    """A fixed but varied script: random completion order, extra decisions, signals, timers."""
    rng = random.Random(seed)
    run = sim.start(workflow_type, data, execution_id=f"{workflow_type}-{seed}")
    for _ in range(60):
        run.decide()
        if rng.random() < 0.3:
            run.decide()
        opened = run.open_activities()
        rng.shuffle(opened)
        for activity_event in opened[: rng.randint(1, 3)]:
            run.execute(activity_event)
        if rng.random() < 0.3:
            run.fire_timers()
        if workflow_type == "mixed" and rng.random() < 0.2:
            run.signal("go", rng.choice(["unwind", "stay"]))
        if workflow_type == "checkout" and rng.random() < 0.05 and run.status == "RUNNING":
            run.cancel("operator")
        if run.status != "RUNNING" and not run.open_activities():
            run.decide()
            break
    return run


SCENARIOS = [
    ("mixed", {}, (mixed, step, flaky_undo)),
    ("checkout", {"order_id": 1}, (checkout,)),
    ("checkout", {"order_id": 2, "out_of_stock": True}, (checkout,)),
    ("fulfillment", {"order_id": "3jam"}, (fulfillment,)),
    ("order_pipeline", {"order_id": 4, "items": [{"qty": 1, "price": 2}]}, (orders,)),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("workflow_type", "data", "objects"), SCENARIOS)
def test_a_warm_replay_decides_exactly_as_a_full_replay(workflow_type, data, objects, seed):
    cold = drive(Simulator(*objects), workflow_type, data, seed)
    warm = drive(Simulator(*objects, sticky=True), workflow_type, data, seed)
    assert [e.to_data() for e in warm.events] == [e.to_data() for e in cold.events]
    assert warm.metrics == cold.metrics and warm.status == cold.status and warm.nd == cold.nd


def test_a_warm_session_is_actually_used():
    sim = Simulator(orders, sticky=True)
    run = sim.start("order_pipeline", {"order_id": 5, "items": [{"qty": 1, "price": 1}]})
    run.decide()
    session = run.session
    assert session is not None
    run.execute(run.open_activities()[0])
    run.decide()
    assert run.session is session  # advanced in place, not rebuilt
