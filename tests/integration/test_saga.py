"""Saga end to end on real Postgres, Redis and Celery workers."""

from __future__ import annotations

import time

import pytest

from harvest_celery import WorkflowFailed

from .conftest import effects, scrape_all, wait_for

pytestmark = pytest.mark.integration

COMPENSATED = "harvest_saga_compensated_total"
FAILED = "harvest_saga_compensation_failed_total"


def names(harvest, run_id):
    return [h.describe() for h in harvest.history(run_id)]


def ran(redis_client, tag):
    return [e["name"] for e in effects(redis_client, tag)]


def test_saga_success_does_not_run_compensations(harvest, workers, redis_client, tag):
    before = scrape_all(COMPENSATED, workflow="saga_steps")
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 3})
    assert harvest.result(run_id, timeout=30) == "ok"
    assert ran(redis_client, tag) == ["forward:1", "forward:2", "forward:3"]
    assert not any("Marker" in n for n in names(harvest, run_id))
    assert scrape_all(COMPENSATED, workflow="saga_steps") == before


def test_saga_runs_compensations_in_reverse_order_when_later_step_fails(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 3, "fail_at": 3})
    with pytest.raises(WorkflowFailed, match="forward 3 failed"):
        harvest.result(run_id, timeout=30)
    assert ran(redis_client, tag) == ["forward:1", "forward:2", "forward:3", "undo:2", "undo:1"]
    hist = names(harvest, run_id)
    assert hist.count("MarkerRecorded(saga_compensated:1)") == 1
    marker = hist.index("MarkerRecorded(saga_compensated:1)")
    # the marker is in the same batch as the first compensation's dispatch
    assert hist[marker + 1] == "ActivityScheduled(undo)"
    undo_queues = {e["queue"] for e in effects(redis_client, tag) if e["name"].startswith("undo")}
    assert undo_queues == {"beta"}


def test_continue_not_abort_with_three_compensations_of_which_the_middle_fails(
    harvest, workers, redis_client, tag
):
    before = (scrape_all(COMPENSATED, workflow="saga_steps"), scrape_all(FAILED, workflow="saga_steps"))
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 4, "fail_at": 4, "undo_fails": [2]})
    with pytest.raises(WorkflowFailed) as info:
        harvest.result(run_id, timeout=30)
    assert info.value.error_type == "SagaCompensationFailed"
    assert info.value.error_message.startswith("saga compensation failed after original error: ")
    assert "forward 4 failed" in info.value.error_message and "undo 2 failed" in info.value.error_message
    assert ran(redis_client, tag)[4:] == ["undo:3", "undo:2", "undo:1"]
    hist = names(harvest, run_id)
    assert hist.count("MarkerRecorded(saga_compensated:1)") == 1
    assert hist.count("MarkerRecorded(saga_compensation_failed:1)") == 1
    after = (scrape_all(COMPENSATED, workflow="saga_steps"), scrape_all(FAILED, workflow="saga_steps"))
    assert after == (before[0] + 1, before[1] + 1)


def test_counters_equal_the_number_of_unwinds_after_replays(harvest, workers, redis_client, tag):
    before = scrape_all(COMPENSATED, workflow="saga_steps")
    runs = [
        harvest.start_workflow("saga_steps", {"tag": f"{tag}{i}", "n": 2, "fail_at": 2}) for i in range(3)
    ]
    for run_id in runs:
        with pytest.raises(WorkflowFailed):
            harvest.result(run_id, timeout=30)
    # Replays: force more decisions of every finished run (a terminal run ignores them) and of a
    # live one, then check nothing was counted twice.
    for run_id in runs:
        for _ in range(3):
            harvest.celery_app.send_task("harvest.decide", args=[run_id], queue="harvest")
    time.sleep(1.5)
    assert scrape_all(COMPENSATED, workflow="saga_steps") == before + 3
    for run_id in runs:
        assert names(harvest, run_id).count("MarkerRecorded(saga_compensated:1)") == 1


def test_saga_compensate_all_on_cancel_pattern(harvest, workers, redis_client, tag):
    before = scrape_all(COMPENSATED, workflow="cancel_and_compensate")
    run_id = harvest.start_workflow("cancel_and_compensate", {"tag": tag, "slow": 2})
    wait_for(lambda: "forward:2" in ran(redis_client, tag), what="the second step's body")
    assert harvest.cancel_workflow_execution(run_id, reason="customer asked") == "CANCELLED"
    wait_for(lambda: names(harvest, run_id)[-1] == "WorkflowCompleted", what="the post-cancel decision")
    row = harvest.describe(run_id)
    assert row.status == "CANCELLED" and not row.nd_blocked
    hist = names(harvest, run_id)
    # the running body kept its claim and its result was recorded after the cancel
    assert hist[hist.index("WorkflowCancelled") :] == [
        "WorkflowCancelled",
        "ActivityCompleted(2)",
        "MarkerRecorded(saga_compensated:1)",
        "WorkflowCompleted",
    ]
    done = [h.event for h in harvest.history(run_id) if h.event.type == "WorkflowCompleted"][0]
    assert done.result == "compensated ['fwd-1']"  # the in-memory compensation ran after the cancel
    assert scrape_all(COMPENSATED, workflow="cancel_and_compensate") == before + 1


def test_saga_cancellation_does_not_auto_compensate(harvest, workers, redis_client, tag):
    before = scrape_all(COMPENSATED, workflow="saga_steps")
    run_id = harvest.start_workflow(
        "saga_steps", {"tag": tag, "n": 2, "slow_at": 2, "slow": 2, "check_cancel": False}
    )
    wait_for(lambda: "forward:2" in ran(redis_client, tag), what="the second step's body")
    harvest.cancel_workflow_execution(run_id, reason="stop")
    wait_for(lambda: names(harvest, run_id)[-1] == "WorkflowCompleted", what="the post-cancel outcome")
    hist = names(harvest, run_id)
    assert hist[hist.index("WorkflowCancelled") :] == [
        "WorkflowCancelled",
        "ActivityCompleted(2)",
        "WorkflowCompleted",
    ]
    assert not any(n.startswith("ActivityScheduled(undo)") or "Marker" in n for n in hist)
    assert not any(e.startswith("undo") for e in ran(redis_client, tag))
    assert harvest.describe(run_id).status == "CANCELLED"
    assert scrape_all(COMPENSATED, workflow="saga_steps") == before


def test_a_cancel_while_a_step_runs_dispatches_and_runs_nothing_more(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 3, "slow_at": 1, "slow": 1.5})
    wait_for(lambda: "forward:1" in ran(redis_client, tag), what="the first body")
    harvest.cancel_workflow_execution(run_id, reason="stop")
    time.sleep(2.5)
    assert ran(redis_client, tag) == ["forward:1"]
    hist = names(harvest, run_id)
    assert "ActivityScheduled(forward)" in hist and hist.count("ActivityScheduled(forward)") == 1
    rows = harvest.store.activity_rows(run_id)
    assert [r["status"] for r in rows] == ["completed"]


def test_known_limitation_durable_compensation_after_recorded_cancel_fails_and_is_counted(
    harvest, workers, redis_client, tag
):
    before = (scrape_all(COMPENSATED, workflow="saga_steps"), scrape_all(FAILED, workflow="saga_steps"))
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 2, "slow_at": 2, "slow": 2})
    wait_for(lambda: "forward:2" in ran(redis_client, tag), what="the second step's body")
    harvest.cancel_workflow_execution(run_id, reason="customer asked")
    wait_for(lambda: names(harvest, run_id)[-1] == "WorkflowFailed", what="the failed unwind")
    hist = names(harvest, run_id)
    assert hist[hist.index("WorkflowCancelled") :] == [
        "WorkflowCancelled",
        "ActivityCompleted(2)",
        "MarkerRecorded(saga_compensated:1)",
        "MarkerRecorded(saga_compensation_failed:1)",
        "WorkflowFailed",
    ]
    failed = [h.event for h in harvest.history(run_id) if h.event.type == "WorkflowFailed"][0]
    assert failed.error_type == "SagaCompensationFailed"
    assert "expected ActivityScheduled(undo), got WorkflowCancelled" in failed.message
    row = harvest.describe(run_id)
    assert row.status == "CANCELLED" and not row.nd_blocked
    assert not any(e.startswith("undo") for e in ran(redis_client, tag))
    after = (scrape_all(COMPENSATED, workflow="saga_steps"), scrape_all(FAILED, workflow="saga_steps"))
    assert after == (before[0] + 1, before[1] + 1)


def test_decision_worker_killed_mid_unwind_resumes_from_the_top_and_records_the_marker_once(
    harvest, workers, redis_client, tag
):
    run_id = harvest.start_workflow("saga_steps", {"tag": tag, "n": 3, "fail_at": 3, "undo_slow": 3})
    wait_for(lambda: "undo:2" in ran(redis_client, tag), what="the first compensation to start")
    invoked_top_before = int(redis_client.get(f"closure:{tag}:2") or 0)
    workers["w1"].kill9()  # the decision worker dies while the unwind is in flight
    workers["w1"].start()
    with pytest.raises(WorkflowFailed, match="forward 3 failed"):
        harvest.result(run_id, timeout=60)
    hist = names(harvest, run_id)
    assert hist.count("MarkerRecorded(saga_compensated:1)") == 1
    assert hist.count("ActivityScheduled(undo)") == 2
    # the resumed replay re-invoked the compensation closures from the top of the stack
    assert int(redis_client.get(f"closure:{tag}:2")) > invoked_top_before
    assert ran(redis_client, tag)[3:] == ["undo:2", "undo:1"]
