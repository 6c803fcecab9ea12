"""Operator actions on real workers: terminate, pause/resume, reset."""

from __future__ import annotations

import time

import pytest

from harvest_celery import InvalidState, WorkflowFailed

from .conftest import effects, wait_for

pytestmark = pytest.mark.integration


def names(harvest, run_id):
    return [h.describe() for h in harvest.history(run_id)]


def test_terminate_seals_without_running_workflow_code(harvest, workers, tag):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    wait_for(lambda: harvest.describe(run_id).history_length >= 1, what="the start")
    harvest.terminate(run_id, reason="stuck")
    row = harvest.describe(run_id)
    assert row.status == "TERMINATED"
    assert names(harvest, run_id)[-1] == "WorkflowFailed"
    with pytest.raises(WorkflowFailed, match="Terminated: stuck"):
        harvest.result(run_id, timeout=5)
    with pytest.raises(InvalidState):
        harvest.signal(run_id, "decision", "late")


def test_a_paused_run_takes_no_decision_until_resumed(harvest, workers, tag):
    run_id = harvest.start_workflow("approval", {"tag": tag})
    time.sleep(0.5)
    harvest.pause(run_id)
    harvest.signal(run_id, "decision", "yes")
    time.sleep(1.5)
    assert harvest.describe(run_id).status == "RUNNING"
    assert names(harvest, run_id)[-1] == "SignalReceived(decision)"  # recorded, not decided on
    harvest.resume(run_id)
    assert harvest.result(run_id, timeout=30) == f"{tag}:yes"


def test_reset_forks_from_a_decision_point_and_reruns_the_rest(harvest, workers, redis_client, tag):
    source = harvest.start_workflow("three_steps", {"tag": tag})
    harvest.result(source, timeout=30)
    new = harvest.reset(source, to_seq=4)  # WorkflowStarted + step_one scheduled/started/completed
    assert harvest.result(new, timeout=30) == f"done:{tag}"
    assert [e["name"] for e in effects(redis_client, tag)] == [
        "step_one",
        "step_two",
        "step_three",
        "step_two",
        "step_three",
    ]
    assert harvest.describe(new).forked_from == source and harvest.describe(source).forked_to == new
    assert names(harvest, new)[:5] == [
        "WorkflowStarted",
        "ActivityScheduled(step_one)",
        "ActivityStarted(1)",
        "ActivityCompleted(1)",
        "ActivityScheduled(step_two)",
    ]


def test_reset_of_a_live_run_terminates_it_and_redispatches_open_activities(
    harvest, workers, redis_client, tag
):
    source = harvest.start_workflow("deployable", {"tag": tag})
    wait_for(lambda: names(harvest, source)[-1] == "ActivityCompleted(2)", what="both first steps")
    new = harvest.reset(source, to_seq=2)  # step_one scheduled, its result not copied: re-run
    assert harvest.describe(source).status == "TERMINATED"
    harvest.signal(new, "go")
    assert harvest.result(new, timeout=30) == f"done:{tag}"
    assert [e["name"] for e in effects(redis_client, tag)].count("step_one") == 2


def test_reset_of_an_erased_run_is_refused(harvest, workers, tag):
    source = harvest.start_workflow("three_steps", {"tag": tag})
    harvest.result(source, timeout=30)
    harvest.erase_payloads(source)
    with pytest.raises(Exception, match="erased"):
        harvest.reset(source, to_seq=4)
