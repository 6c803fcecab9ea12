"""The fulfillment DAG from workflows/ over 1000 runs with random forward failures and random
extra replays (a decision re-run as after a crash): every run either completes with all three side
effects live, or fails with none of them left — zero uncompensated side effects."""

from __future__ import annotations

import random

from harvest_celery.examples import fulfillment
from harvest_celery.testing import Simulator


def test_fulfillment_dag_leaves_zero_uncompensated_side_effects_across_1000_runs():
    rng = random.Random(801)
    sim = Simulator(fulfillment)
    forward = {
        "reserve_stock": fulfillment.reserve_stock,
        "capture_payment": fulfillment.capture_payment,
        "print_label": fulfillment.print_label,
    }
    fail_at: dict[str, str | None] = {}

    def failing(name: str, fn):
        def body(value):
            if fail_at["current"] == name:
                raise RuntimeError(f"{name} failed")
            return fn(value)

        return body

    for name, fn in forward.items():
        sim.behaviour[name] = failing(name, fn)
    outcomes = {"COMPLETED": 0, "FAILED": 0}
    for i in range(1000):
        fail_at["current"] = rng.choice([None, "reserve_stock", "capture_payment", "print_label"])
        run = sim.start("fulfillment", {"order_id": f"soak{i}"}, execution_id=f"run-{i}")
        for _ in range(50):
            before = len(run.history)
            run.decide()
            if rng.random() < 0.3:
                run.decide()  # a replay of the same history: must change nothing
            for activity in run.open_activities():
                run.execute(activity)
            if run.status != "RUNNING" or len(run.history) == before:
                break
        outcomes[run.status] += 1
        live = {
            k: v
            for k, v in fulfillment.STATE.items()
            if k.endswith(f"-soak{i}") and v in ("reserved", "captured", "printed")
        }
        if run.status == "COMPLETED":
            assert fail_at["current"] is None
            assert set(live.values()) == {"reserved", "captured", "printed"}
        else:
            assert run.status == "FAILED" and fail_at["current"] is not None
            assert live == {}, (i, fail_at["current"], live)
            assert run.replay().nd is None
        assert run.types().count("MarkerRecorded") == (
            1 if fail_at["current"] not in (None, "reserve_stock") else 0
        )
    assert outcomes["COMPLETED"] > 200 and outcomes["FAILED"] > 600
