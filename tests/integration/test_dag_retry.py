"""Retry-from-node and its refusals, on real Postgres, Redis and Celery workers."""

from __future__ import annotations

import pytest

from harvest_celery import WorkflowFailed
from harvest_celery._dag.retry import COMPENSATED
from harvest_celery._errors import RetryRefused, UnknownNode

from .conftest import effects, wait_for

pytestmark = pytest.mark.integration


def ran(redis_client, tag):
    return [e["name"] for e in effects(redis_client, tag)]


def names(harvest, run_id):
    return [h.describe() for h in harvest.history(run_id)]


def failed_run(harvest, dag, conf):
    run_id = harvest.start_workflow(dag, conf)
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    return run_id


def test_a_retry_from_the_failed_node_carries_the_upstream_and_completes(harvest, workers, redis_client, tag):
    source = failed_run(harvest, "retryable", {"tag": tag})
    assert ran(redis_client, tag) == ["rt_a", "rt_b"]
    dry = harvest.retry_dag_run("retryable", source, dry_run=True)
    assert dry["run_id"] is None and dry["retry_from"] == "rt_b" and dry["carried"] == ["rt_a"]
    assert harvest.describe(source).forked_to is None  # a dry run forks nothing
    answer = harvest.retry_dag_run("retryable", source)
    new = answer["run_id"]
    out = harvest.result(new, timeout=30)
    assert set(out) == {"rt_a", "rt_b", "rt_c"}
    assert ran(redis_client, tag) == ["rt_a", "rt_b", "rt_b", "rt_c"]  # rt_a was carried, not re-run
    assert out["rt_b"]["saw"] == {"tag": tag, "node": "rt_a"}  # fed the carried output
    assert harvest.describe(new).forked_from == source
    assert harvest.describe(source).forked_to == new
    assert names(harvest, new)[1] == "ActivityScheduled(rt_b)"
    with pytest.raises(RetryRefused) as again:  # a double click must not fork twice
        harvest.retry_dag_run("retryable", source)
    assert again.value.reason == "retried" and new in str(again.value)


def test_retry_refuses_a_run_whose_unwind_ran(harvest, workers, redis_client, tag):
    source = failed_run(harvest, "diamond", {"tag": tag, "fail": ["dia_d"]})
    with pytest.raises(RetryRefused) as info:
        harvest.retry_dag_run("diamond", source)
    assert info.value.reason == "compensated" and str(info.value) == COMPENSATED


def test_retry_refuses_a_marker_less_unwind_by_the_envelope_signal(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("drained", {"tag": tag, "slow": "ds_slow"})
    wait_for(lambda: "ds_slow" in ran(redis_client, tag), what="the slow node")
    harvest.signal(run_id, "stray", {"unsolicited": True})  # drains the frontier: no marker
    with pytest.raises(WorkflowFailed):
        harvest.result(run_id, timeout=30)
    hist = names(harvest, run_id)
    assert not any(n.startswith("MarkerRecorded") for n in hist)
    assert "undo:ds_first" in ran(redis_client, tag)  # the compensation still ran
    with pytest.raises(RetryRefused, match="already executed its compensation unwind"):
        harvest.retry_dag_run("drained", run_id)


def test_a_bare_marker_with_no_dispatch_after_it_stays_retryable(harvest, workers, redis_client, tag):
    source = failed_run(harvest, "oversized_envelope", {"tag": tag})
    hist = names(harvest, source)
    assert "MarkerRecorded(saga_compensated:1)" in hist
    assert not any(n == "ActivityScheduled(undo_node)" for n in hist)
    failed = [h.event for h in harvest.history(source) if h.event.type == "WorkflowFailed"][0]
    assert failed.error_type == "SagaCompensationFailed" and "payload too large" in failed.message
    answer = harvest.retry_dag_run("oversized_envelope", source, dry_run=True)
    assert answer["retry_from"] == "bo_fail" and answer["carried"] == ["big_out"]


def test_retry_refuses_an_erased_run_even_without_compensators(harvest, workers, redis_client, tag):
    source = failed_run(harvest, "retryable", {"tag": tag, "fail": ["rt_a"]})
    harvest.erase_payloads(source)
    with pytest.raises(RetryRefused) as info:
        harvest.retry_dag_run("retryable", source)
    assert info.value.reason == "erased" and "erased" in str(info.value)


def test_erasure_landing_between_the_preflight_and_the_forks_lock_is_refused(
    harvest, workers, redis_client, tag, monkeypatch
):
    source = failed_run(harvest, "retryable", {"tag": tag})
    import harvest_celery._dag.retry as dag_retry

    real_plan = dag_retry.plan_retry

    def plan_then_erase(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        harvest.erase_payloads(source)  # commits after the pre-flight passed on the intact row
        return plan

    monkeypatch.setattr(dag_retry, "plan_retry", plan_then_erase)
    with pytest.raises(RetryRefused) as info:
        harvest.retry_dag_run("retryable", source)
    assert info.value.reason == "erased"
    assert harvest.describe(source).forked_to is None  # nothing was forked
    assert harvest.list(workflow="retryable", status="RUNNING") == [] or all(
        r.forked_from != source for r in harvest.list(workflow="retryable")
    )


def test_retry_refuses_running_and_completed_runs_and_unknown_nodes(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("cancellable", {"tag": tag, "slow": "cx_slow"})
    wait_for(lambda: "cx_slow" in ran(redis_client, tag), what="the slow node")
    with pytest.raises(RetryRefused, match="still running"):
        harvest.retry_dag_run("cancellable", run_id)
    source = failed_run(harvest, "retryable", {"tag": tag})
    with pytest.raises(UnknownNode, match="no node 'nope'"):
        harvest.retry_dag_run("retryable", source, "nope")
    done = harvest.retry_dag_run("retryable", source)["run_id"]
    harvest.result(done, timeout=30)
    with pytest.raises(RetryRefused, match="completed"):
        harvest.retry_dag_run("retryable", done)
