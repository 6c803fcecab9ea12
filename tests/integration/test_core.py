"""The durable core end to end: real Postgres, Redis and two Celery worker processes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harvest_celery import UnknownWorkflow
from harvest_celery._store.store import Store

from .conftest import effects, wait_for

pytestmark = pytest.mark.integration


def types(harvest: Any, run_id: str) -> list[str]:
    return [h.describe() for h in harvest.history(run_id)]


def test_three_step_workflow_across_two_workers_records_the_exact_history(
    harvest, workers, redis_client, tag
):
    run_id = harvest.start_workflow("three_steps", {"tag": tag}, execution_id=f"three-{tag}")
    assert harvest.result(run_id, timeout=30) == f"done:{tag}"
    assert types(harvest, run_id) == [
        "WorkflowStarted",
        "ActivityScheduled(step_one)",
        "ActivityStarted(1)",
        "ActivityCompleted(1)",
        "ActivityScheduled(step_two)",
        "ActivityStarted(2)",
        "ActivityCompleted(2)",
        "ActivityScheduled(step_three)",
        "ActivityStarted(3)",
        "ActivityCompleted(3)",
        "WorkflowCompleted",
    ]
    ran = effects(redis_client, tag)
    assert [e["name"] for e in ran] == ["step_one", "step_two", "step_three"]
    # each activity ran on the queue it names, on the worker that consumes that queue
    assert [e["queue"] for e in ran] == ["alpha", "beta", "alpha"]
    assert ran[0]["worker"].startswith("w1-") and ran[1]["worker"].startswith("w2-")
    assert harvest.describe(run_id).status == "COMPLETED"


def test_start_is_idempotent_on_execution_id(harvest, workers, tag):
    first = harvest.start_workflow("three_steps", {"tag": tag}, execution_id=f"idem-{tag}")
    second = harvest.start_workflow("three_steps", {"tag": tag}, execution_id=f"idem-{tag}")
    assert first == second
    harvest.result(first, timeout=30)
    assert [h.describe() for h in harvest.history(first)].count("WorkflowStarted") == 1


def test_unknown_workflow_writes_nothing(harvest, workers, tag):
    with pytest.raises(UnknownWorkflow, match="nope"):
        harvest.start_workflow("nope", {}, execution_id=f"unknown-{tag}")
    assert harvest.list(workflow="nope") == []


def test_retry_policy_retries_with_a_started_event_per_attempt(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("retrying", {"tag": tag, "succeed_on": 3})
    assert harvest.result(run_id, timeout=30) == "ok after 3"
    assert types(harvest, run_id)[1:6] == [
        "ActivityScheduled(flaky)",
        "ActivityStarted(1)",
        "ActivityStarted(1)",
        "ActivityStarted(1)",
        "ActivityCompleted(1)",
    ]
    attempts = [h.event.attempt for h in harvest.history(run_id) if h.event.type == "ActivityStarted"]
    assert attempts == [1, 2, 3]


def test_non_retryable_error_fails_at_once(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("non_retryable", {"tag": tag})
    with pytest.raises(Exception, match="ValueError: bad order"):
        harvest.result(run_id, timeout=30)
    assert len(effects(redis_client, tag)) == 1
    assert types(harvest, run_id)[-2:] == ["ActivityFailed(1)", "WorkflowFailed"]


def test_fan_out_dispatches_every_member_in_one_decision(harvest, workers, tag):
    run_id = harvest.start_workflow("fan_out", {"tag": tag, "n": 5})
    out = harvest.result(run_id, timeout=30)
    assert [o["i"] for o in out] == [0, 1, 2, 3, 4]
    hist = types(harvest, run_id)
    assert hist[1:6] == ["ActivityScheduled(step_one)"] * 5


def test_durable_timer_fires_from_postgres(harvest, workers, tag):
    run_id = harvest.start_workflow("sleeper", {"tag": tag, "seconds": 0.5})
    assert harvest.result(run_id, timeout=30) == f"done:{tag}"
    assert types(harvest, run_id)[1:3] == ["TimerStarted(1)", "TimerFired"]


def test_concurrent_decisions_never_fork_a_history(harvest, workers, tag):
    run_id = harvest.start_workflow("fan_out", {"tag": tag, "n": 8})
    # Hammer the same execution with decisions from this process and from the worker at once.
    store = Store(harvest.database_url)
    errors: list[BaseException] = []

    def decide_many() -> None:
        try:
            for _ in range(10):
                harvest.runtime.run_decision(run_id)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=decide_many) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(10):
        harvest.celery_app.send_task("harvest.decide", args=[run_id], queue="harvest")
    for t in threads:
        t.join()
    assert errors == []
    harvest.result(run_id, timeout=30)
    seqs = [h.seq for h in store.history(run_id)]
    assert seqs == list(range(len(seqs)))
    hist = types(harvest, run_id)
    assert hist.count("ActivityScheduled(step_one)") == 8
    assert hist.count("WorkflowCompleted") == 1


def test_reordering_code_nd_blocks_and_reverting_lets_it_complete(harvest, workers, redis_client, tag):
    w1 = workers["w1"]  # the decision worker
    run_id = harvest.start_workflow("deployable", {"tag": tag})
    wait_for(lambda: len(effects(redis_client, tag)) == 2, what="both first steps ran")
    wait_for(lambda: types(harvest, run_id)[-1] == "ActivityCompleted(2)", what="second step recorded")
    try:
        w1.restart({"DEPLOYED_VERSION": "2"})  # the deploy that swaps the first two steps
        harvest.signal(run_id, "go")
        row = wait_for(lambda: (r := harvest.describe(run_id)).nd_blocked and r, what="nd-block")
        assert row.status == "RUNNING"
        assert row.nd_details["expected"] == "ActivityScheduled(step_two)"
        assert row.nd_details["actual"] == "ActivityScheduled(step_one)"
        assert run_id in [r.id for r in harvest.list(nd_blocked=True)]
        length = len(harvest.history(run_id))
        wait_for(lambda: harvest.describe(run_id).nd_block_count >= 2, what="a retried nd-block")
        assert len(harvest.history(run_id)) == length  # nd-blocked decisions append nothing
    finally:
        w1.restart({"DEPLOYED_VERSION": "1"})  # roll the code back
    assert harvest.result(run_id, timeout=30) == f"done:{tag}"
    assert not harvest.describe(run_id).nd_blocked
    assert run_id not in [r.id for r in harvest.list(nd_blocked=True)]


def test_an_existing_celery_task_adopted_by_name_runs_as_an_activity(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("notify", {"tag": tag, "to": "ada@example.com"})
    assert harvest.result(run_id, timeout=30) == "sent to ada@example.com"
    ran = effects(redis_client, tag)
    assert [e["name"] for e in ran] == ["step_one", "send_email"]
    assert ran[1]["queue"] == "beta"
    assert types(harvest, run_id)[4:7] == [
        "ActivityScheduled(legacy.send_email)",
        "ActivityStarted(2)",
        "ActivityCompleted(2)",
    ]


def test_signal_with_start_creates_the_run_and_delivers_the_signal(harvest, workers, tag):
    run_id = harvest.signal_with_start("approval", {"tag": tag}, f"sws-{tag}", "decision", "approved")
    assert run_id == f"sws-{tag}"
    assert harvest.result(run_id, timeout=30) == f"{tag}:approved"
    hist = types(harvest, run_id)
    assert hist[:2] == ["WorkflowStarted", "SignalReceived(decision)"]
