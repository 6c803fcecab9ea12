"""Targeted faults: kill -9 mid-body, a failing pre-run append, a lost message."""

from __future__ import annotations

import time

import pytest

from .conftest import effects, wait_for

pytestmark = pytest.mark.integration


def names(harvest, run_id):
    return [h.describe() for h in harvest.history(run_id)]


def test_kill_9_of_an_activity_worker_mid_body_redelivers_and_completes(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("survives_kill", {"tag": tag}, execution_id=f"kill-{tag}")
    wait_for(
        lambda: any(e["name"] == "slow_started" for e in effects(redis_client, tag)), what="the body to start"
    )
    workers["w2"].kill9()
    workers["w2"].start()
    assert harvest.result(run_id, timeout=60) == "finished on attempt body 2"
    hist = harvest.history(run_id)
    completed = [h for h in hist if h.event.type == "ActivityCompleted" and h.event.activity_id == "1"]
    assert len(completed) == 1
    started = [
        h.event.attempt for h in hist if h.event.type == "ActivityStarted" and h.event.activity_id == "1"
    ]
    assert started == [1, 2]
    ran = [e["name"] for e in effects(redis_client, tag)]
    assert ran.count("slow_started") == 2 and ran.count("slow_finished") == 1


def test_a_failed_activity_started_append_never_runs_the_body_and_is_redispatched(
    harvest, workers, redis_client, tag
):
    run_id = f"claimfail-{tag}"
    redis_client.set(f"fail_claim:{run_id}", 1)
    harvest.start_workflow("three_steps", {"tag": tag}, execution_id=run_id)
    wait_for(lambda: redis_client.get(f"claim_failures:{run_id}") == b"1", what="the injected failure")
    # The append failed: no ActivityStarted, and the body did not run. The first activity is
    # claimed in the write of the decision that schedules it when that decision's worker runs
    # it eagerly — then the failed append failed that whole write (no task row yet, the
    # decision request stands); else the claim of the delivered message failed (the row stays
    # scheduled). Either way the sweeper re-sends what is durable, and the next claim succeeds.
    assert "ActivityStarted(1)" not in names(harvest, run_id)
    assert effects(redis_client, tag) == []
    assert [row["status"] for row in harvest.store.activity_rows(run_id)] in ([], ["scheduled"])
    assert harvest.result(run_id, timeout=60) == f"done:{tag}"
    assert [e["name"] for e in effects(redis_client, tag)] == ["step_one", "step_two", "step_three"]
    assert names(harvest, run_id).count("ActivityStarted(1)") == 1


def test_a_duplicate_delivery_never_runs_a_body_twice(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("three_steps", {"tag": tag}, execution_id=f"dup-{tag}")
    harvest.result(run_id, timeout=30)
    # Re-send every activity message the engine sent, as a broker redelivery would.
    for row in harvest.store.activity_rows(run_id):
        harvest.celery_app.send_task(
            row["activity_name"], args=[run_id, row["activity_id"], row["attempt"]], queue=row["queue"]
        )
    harvest.celery_app.send_task("harvest.decide", args=[run_id], queue="harvest")
    time.sleep(2)  # give the workers time to (wrongly) run anything twice
    assert [e["name"] for e in effects(redis_client, tag)] == ["step_one", "step_two", "step_three"]
    hist = names(harvest, run_id)
    assert hist.count("ActivityStarted(1)") == 1 and hist.count("ActivityCompleted(1)") == 1
    assert hist[-1] == "WorkflowCompleted"
