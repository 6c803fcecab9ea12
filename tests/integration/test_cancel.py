"""Cancellation users can rely on, end to end on real Postgres, Redis and Celery workers:
``result()`` waits for a sealed run's cancel branch and carries its outcome; a failed branch is
flagged where operators look; cooperative cancel runs a durable refund; an activity learns of a
cancel; a sealed DAG dispatches no new node; the run graph degrades on any store error."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harvest_celery import (
    Harvest,
    PostgresPayloadStore,
    RetryPolicy,
    WorkflowCancelledError,
    WorkflowFailed,
    activity,
    workflow,
)
from harvest_celery._cli import main
from harvest_celery._core.commands import Failed
from harvest_celery._core.engine import replay_history
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import tasks
from harvest_celery._store.store import utcnow
from harvest_celery._web.api import create_app

from .conftest import DATABASE_URL, effects, scrape_all, wait_for, worker_env, workers_decide

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _open_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARVEST_API_TOKEN", raising=False)  # the API clients here send no token


def release(redis_client: Any, tag: str, name: str) -> None:
    """Let the body held on ``name`` finish (``cancels.hold``)."""
    redis_client.set(f"release:{tag}:{name}", 1, ex=600)


def ran(redis_client: Any, tag: str) -> list[str]:
    return [e["name"] for e in effects(redis_client, tag)]


def names(harvest: Any, run_id: str) -> list[str]:
    return [h.describe() for h in harvest.history(run_id)]


def cancelled(harvest: Any, run_id: str, timeout: float = 30) -> WorkflowCancelledError:
    with pytest.raises(WorkflowCancelledError) as info:
        harvest.result(run_id, timeout=timeout)
    return info.value


def started(redis_client: Any, tag: str, name: str) -> None:
    wait_for(lambda: name in ran(redis_client, tag), what=f"{name} to start")


# ── result() waits for the cancel branch ─────────────────────────────────────────────────────
def test_result_waits_for_the_branch_and_carries_what_it_returned(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("cancel_and_compensate", {"tag": tag, "slow": 2})
    started(redis_client, tag, "forward:2")
    harvest.cancel_workflow_execution(run_id, reason="customer asked")
    err = cancelled(harvest, run_id)  # at once: before the post-cancel decision has run
    assert (err.outcome, err.value, err.reason) == ("returned", "compensated ['fwd-1']", "customer asked")
    assert names(harvest, run_id)[-1] == "WorkflowCompleted"  # it waited for the branch
    assert "the cancel branch returned" in str(err)


def test_result_times_out_pending_then_carries_the_failed_branch(harvest, workers, redis_client, tag):
    before = scrape_all("harvest_cancel_branch_failed_total", workflow="coop_checkout")
    run_id = harvest.start_workflow("coop_checkout", {"tag": tag})
    started(redis_client, tag, "pack:start")
    harvest.cancel_workflow_execution(run_id, reason="operator")
    t0 = time.monotonic()
    err = cancelled(harvest, run_id, timeout=1)  # pack still runs: the branch has not settled
    assert err.outcome == "pending" and time.monotonic() - t0 < 5
    release(redis_client, tag, "pack")
    err = cancelled(harvest, run_id)
    assert err.outcome == "failed" and err.error.startswith("SagaCompensationFailed: ")
    assert "expected ActivityScheduled(cx_refund), got WorkflowCancelled" in err.error
    assert "refund:start" not in ran(redis_client, tag)  # the spec's known limitation, unchanged
    assert harvest.describe(run_id).display_status.startswith(
        "CANCELLED (cancel branch failed: SagaCompensationFailed: "
    )
    wait_for(
        lambda: scrape_all("harvest_cancel_branch_failed_total", workflow="coop_checkout") == before + 1,
        what="the cancel_branch_failed counter",
    )


def test_harvest_list_and_show_flag_a_failed_cancel_branch(harvest, workers, redis_client, tag, capsys):
    run_id = harvest.start_workflow("coop_checkout", {"tag": tag})
    started(redis_client, tag, "pack:start")
    harvest.cancel_workflow_execution(run_id, reason="operator")
    release(redis_client, tag, "pack")
    assert cancelled(harvest, run_id).outcome == "failed"
    capsys.readouterr()
    assert (
        main(["--database-url", DATABASE_URL, "list", "--workflow", "coop_checkout", "--limit", "1000"]) == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(run_id))
    assert "CANCELLED (cancel branch failed: SagaCompensationFailed" in line
    assert main(["--database-url", DATABASE_URL, "show", run_id]) == 0
    assert (
        f"{run_id}  coop_checkout  CANCELLED (cancel branch failed: SagaCompensationFailed"
        in capsys.readouterr().out
    )
    body = TestClient(create_app(harvest)).get(f"/workflows/{run_id}").json()
    assert body["status"] == "CANCELLED" and body["display_status"].startswith("CANCELLED (cancel branch")
    assert body["cancel_branch"]["outcome"] == "failed" and body["cancel_branch"]["settled"]
    assert body["cancel_branch_error"].startswith("SagaCompensationFailed: ")


def test_result_of_a_branch_left_waiting_is_stopped(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("cx_parked", {"tag": tag})
    wait_for(lambda: harvest.store.decision_request(run_id)[1] is None, what="the first decision")
    harvest.cancel_workflow_execution(run_id, reason="nobody approves")
    err = cancelled(harvest, run_id)
    assert err.outcome == "stopped" and err.error is None
    assert "stopped" in str(err)


def test_result_of_a_branch_that_raised_cancelled(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("seal_checkout", {"tag": tag})
    started(redis_client, tag, "pack:start")
    harvest.cancel_workflow_execution(run_id, reason="operator")
    release(redis_client, tag, "pack")
    err = cancelled(harvest, run_id)
    assert err.outcome == "cancelled"
    assert err.error == f"Cancelled: operator; undone ['ch_{tag}']"  # in memory: it ran
    assert harvest.describe(run_id).display_status == "CANCELLED"


# ── cooperative cancel ───────────────────────────────────────────────────────────────────────
def cooperative_refund(harvest: Any, redis_client: Any, tag: str, capsys: Any) -> list[str]:
    """The cooperative cancel with a durable refund, checked at each step; its history."""
    before = scrape_all("harvest_saga_compensated_total", workflow="coop_checkout")
    run_id = harvest.start_workflow("coop_checkout", {"tag": tag, "hold_refund": True})
    started(redis_client, tag, "pack:start")
    assert harvest.request_cancellation(run_id, reason="customer asked") is True
    assert harvest.request_cancellation(run_id, reason="again") is False  # idempotent
    row = harvest.describe(run_id)
    assert (row.status, row.display_status, row.cancelled_at) == ("RUNNING", "CANCELLING", None)
    release(redis_client, tag, "pack")
    started(redis_client, tag, "refund:start")  # the durable refund runs, as an activity
    row = harvest.describe(run_id)
    assert (row.status, row.display_status) == ("RUNNING", "CANCELLING")
    capsys.readouterr()
    main(["--database-url", DATABASE_URL, "list", "--status", "cancelling", "--limit", "1000"])
    assert any(x.startswith(run_id) and "CANCELLING" in x for x in capsys.readouterr().out.splitlines())
    body = TestClient(create_app(harvest)).get(f"/workflows/{run_id}").json()
    assert (body["status"], body["display_status"]) == ("RUNNING", "CANCELLING")
    release(redis_client, tag, "refund")
    err = cancelled(harvest, run_id)
    assert (err.outcome, err.error) == ("cancelled", "Cancelled: customer asked")
    assert harvest.describe(run_id).status == harvest.describe(run_id).display_status == "CANCELLED"
    assert ran(redis_client, tag)[-2:] == ["refund:start", "refund:end"]
    hist = names(harvest, run_id)
    assert hist.count("WorkflowCancelRequested") == 1
    assert (
        hist.index("WorkflowCancelRequested")
        < hist.index("MarkerRecorded(saga_compensated:1)")
        < hist.index("ActivityScheduled(cx_refund)")
    )
    assert hist[-1] == "WorkflowFailed" and not harvest.describe(run_id).nd_blocked
    # a cold replay of the whole history with today's code decides exactly what was recorded
    probe = replay_history(
        harvest.registry.workflow("coop_checkout"), run_id, harvest.history(run_id), harvest.registry
    )
    assert probe.nd is None and probe.commands == []
    assert probe.outcome == Failed("Cancelled", "customer asked")
    wait_for(
        lambda: scrape_all("harvest_saga_compensated_total", workflow="coop_checkout") == before + 1,
        what="the compensated counter (the unwind counted once)",
    )
    return hist


def test_a_cooperative_cancel_runs_a_durable_refund_reads_cancelling_and_ends_cancelled(
    harvest, workers, redis_client, tag, capsys
):
    warm = cooperative_refund(harvest, redis_client, tag, capsys)
    # the same run on workers that keep no warm replay: every decision replays cold, and the
    # run reads and ends the same, with the same history
    with worker_env(workers, HARVEST_TEST_COLD="1"):
        cold = cooperative_refund(harvest, redis_client, f"{tag}-cold", capsys)
    assert cold == warm


def test_request_cancel_over_the_cli_and_the_api(harvest, workers, redis_client, tag, capsys):
    client = TestClient(create_app(harvest))
    run_id = harvest.start_workflow("coop_checkout", {"tag": tag})
    started(redis_client, tag, "pack:start")
    resp = client.post(f"/workflows/{run_id}/request-cancel", json={"reason": "api"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"execution_id": run_id, "requested": True, "display_status": "CANCELLING"}
    capsys.readouterr()
    assert main(["--app", "tests.integration.app", "request-cancel", run_id, "--reason", "cli"]) == 0
    assert capsys.readouterr().out.strip() == f"{run_id} CANCELLING (a cancellation was already requested)"
    release(redis_client, tag, "pack")
    assert cancelled(harvest, run_id).error == "Cancelled: api"
    again = client.post(f"/workflows/{run_id}/request-cancel")
    assert again.status_code == 409 and again.json()["error"] == "InvalidState"


def test_a_seal_cancel_during_cancelling_still_seals(harvest, workers, redis_client, tag):
    run_id = harvest.start_workflow("coop_checkout", {"tag": tag, "hold_refund": True})
    started(redis_client, tag, "pack:start")
    harvest.request_cancellation(run_id, reason="customer asked")
    release(redis_client, tag, "pack")
    started(redis_client, tag, "refund:start")
    assert harvest.cancel_workflow_execution(run_id, reason="operator") == "FAILED"  # mid-unwind
    release(redis_client, tag, "refund")  # the running refund keeps its claim; it is recorded
    err = cancelled(harvest, run_id)
    assert (err.outcome, err.reason) == ("cancelled", "operator")
    assert "refund:end" in ran(redis_client, tag) and not harvest.describe(run_id).nd_blocked


# ── activities learn of cancellation ─────────────────────────────────────────────────────────
@pytest.mark.parametrize("how", ["request", "seal"])
def test_a_long_activity_learns_of_the_cancel_and_stops_early(harvest, workers, redis_client, tag, how):
    run_id = harvest.start_workflow("watched", {"tag": tag})
    started(redis_client, tag, "watch:start")
    if how == "request":
        harvest.request_cancellation(run_id, reason="stop watching")
    else:
        harvest.cancel_workflow_execution(run_id, reason="stop watching")
    started(redis_client, tag, "watch:stopped")
    err = cancelled(harvest, run_id)
    assert (err.outcome, err.error) == ("cancelled", "Cancelled: stop watching")
    attempts = harvest.store.attempt_errors(run_id)
    assert [(a.activity_id, a.error_type) for a in attempts if a.activity_id] == [("1", "RuntimeError")]
    assert "stopped early" in attempts[0].message


# ── the DAG cancel edge ──────────────────────────────────────────────────────────────────────
def test_a_cancelled_dag_never_dispatches_a_new_node_and_keeps_the_dag_error(
    harvest, workers, redis_client, tag
):
    """a → b, a → c → e: b fails, the cancel lands while c runs, then c succeeds. e is never
    dispatched; the error stays the DAG's; never nd-blocked."""
    run_id = harvest.start_workflow("cancel_edge", {"tag": tag, "fail": ["ce_b"], "hold": ["ce_c"]})
    started(redis_client, tag, "ce_c:start")
    wait_for(
        lambda: (
            "ActivityFailed(3)" in names(harvest, run_id) or "ActivityFailed(2)" in names(harvest, run_id)
        ),
        what="b's failure",
    )
    assert harvest.cancel_workflow_execution(run_id, reason="operator") == "CANCELLED"
    release(redis_client, tag, "ce_c")
    err = cancelled(harvest, run_id)
    assert (err.outcome, err.error) == ("failed", "DagTaskFailed: one or more DAG tasks failed")
    assert "ce_c:end" in ran(redis_client, tag) and "ce_e:start" not in ran(redis_client, tag)
    hist = names(harvest, run_id)
    assert "ActivityScheduled(ce_e)" not in hist and "ActivityScheduled(ce_undo)" not in hist
    row = harvest.describe(run_id)
    assert row.status == "CANCELLED" and not row.nd_blocked and row.nd_details is None


def test_a_cancel_mid_dag_unwind_counts_as_a_hand_written_saga_does(harvest, workers, redis_client, tag):
    """e fails: the unwind undoes c, b, a (LIFO of level order). The cancel lands while c's
    compensator runs; it finishes, then b's and a's diverge against the seal and are collected:
    SagaCompensationFailed, both markers, both counters once — the dangling state pages."""
    labels = {"workflow": "cancel_edge"}
    before = (
        scrape_all("harvest_saga_compensated_total", **labels),
        scrape_all("harvest_saga_compensation_failed_total", **labels),
    )
    run_id = harvest.start_workflow("cancel_edge", {"tag": tag, "fail": ["ce_e"], "hold_undo": ["ce_c"]})
    started(redis_client, tag, "undo:ce_c")
    assert harvest.cancel_workflow_execution(run_id, reason="operator") == "FAILED"  # mid-unwind
    release(redis_client, tag, "undo:ce_c")
    err = cancelled(harvest, run_id)
    assert err.outcome == "failed" and err.error.startswith(
        "SagaCompensationFailed: saga compensation failed after original error: one or more DAG tasks failed;"
    )
    assert err.error.count("expected ActivityScheduled(ce_undo), got WorkflowCancelled") == 2
    assert [n for n in ran(redis_client, tag) if n.startswith("undo:")] == ["undo:ce_c"]
    hist = names(harvest, run_id)
    assert hist.count("MarkerRecorded(saga_compensated:1)") == 1
    assert hist.index("WorkflowCancelled") < hist.index("MarkerRecorded(saga_compensation_failed:1)")
    assert not harvest.describe(run_id).nd_blocked
    wait_for(
        lambda: (
            (
                scrape_all("harvest_saga_compensated_total", **labels),
                scrape_all("harvest_saga_compensation_failed_total", **labels),
            )
            == (before[0] + 1, before[1] + 1)
        ),
        what="both saga counters, once",
    )


# ── the run graph and retry degrade on any store error ───────────────────────────────────────
class FlakyStore(PostgresPayloadStore):
    """The workers' Postgres store ("pg"), as an API process reads it, until its disk fails."""

    broken = False

    def get(self, key: str) -> bytes:
        if self.broken:
            raise OSError(5, "Input/output error", key)
        return super().get(key)


def test_the_run_graph_degrades_and_retry_answers_503_on_an_oserror(harvest, workers, redis_client, tag):
    from . import dags

    # the workers offload what is over 256 B (their store: their decision takes the first step)
    with worker_env(workers, HARVEST_TEST_OFFLOAD="256"), workers_decide(harvest):
        source = harvest.start_workflow("retryable", {"tag": tag, "pad": "p" * 1024})
        with pytest.raises(WorkflowFailed, match="one or more DAG tasks failed"):
            harvest.result(source, timeout=30)
    assert ran(redis_client, tag) == ["rt_a", "rt_b"]
    store = FlakyStore()
    reader = Harvest(DATABASE_URL, payload_store=store, offload_threshold=256)
    reader.register(*dags.ACTIVITIES, *dags.DAGS)  # the API's process: it only reads
    try:
        client = TestClient(create_app(reader))
        assert (
            client.get(f"/workflows/{source}/history").json()["events"][1]["data"]["input"]["conf"]["pad"]
            == "p" * 1024
        )  # inflated while the store works
        store.broken = True
        graph = client.get(f"/dags/retryable/runs/{source}")
        assert graph.status_code == 200, graph.text
        assert [n["status"] for n in graph.json()["nodes"]] == ["succeeded", "failed", "skipped"]
        described = client.get(f"/workflows/{source}")
        assert described.status_code == 200 and described.json()["status"] == "FAILED"
        history = client.get(f"/workflows/{source}/history")
        assert history.status_code == 200
        reference = history.json()["events"][1]["data"]["input"]  # rt_a's input, left raw
        assert reference["_harvest_offload_envelope"] == 1 and reference["store_id"] == "pg"
        retried = client.post(f"/dags/retryable/runs/{source}/retry")
        assert retried.status_code == 503, retried.text
        assert retried.json()["error"] == "PayloadStoreError" and "OSError" in retried.json()["detail"]
    finally:
        reader.store.engine.dispose()
        store.engine.dispose()


# ── a late completion after an expired lease and a cancel (Postgres's one-statement path) ────
@activity(name="pg_late_charge", retry=RetryPolicy(max_attempts=3))
def pg_late_charge(data: Any) -> str:
    return "ch-1"


@workflow(name="pg_late_checkout")
async def pg_late_checkout(ctx: Any, data: Any) -> Any:
    return await ctx.execute_activity("pg_late_charge", data)


@pytest.fixture
def by_hand(harvest: Any) -> Any:
    """A Harvest on the test database whose messages are delivered by hand (no worker knows
    its workflow, so no sweeper of theirs touches its runs)."""
    h = Harvest(DATABASE_URL).register(pg_late_checkout, pg_late_charge)
    h._inline = None
    h.runtime.dispatcher = InlineDispatcher()
    yield h
    h.store.engine.dispose()


def _types(h: Any, run_id: str) -> list[str]:
    return [e.event.type for e in h.store.history(run_id)]


def test_a_cancel_after_an_expired_lease_records_the_late_completion_of_the_body_that_ran(by_hand, tag):
    h = by_hand
    run_id = h.start_workflow("pg_late_checkout", {"tag": tag})
    h.runtime.run_decision(run_id)
    claim = h.runtime.claim(run_id, "1", 1)
    with h.store.begin() as tx:  # the lease ran out while the completion was held up
        tasks.expire_lease(tx, run_id, "1", 1, utcnow() + timedelta(seconds=600), "harvest")
    assert h.store.activity_rows(run_id)[0]["status"] == "retry_wait"
    h.cancel_workflow_execution(run_id, "customer asked")
    h.runtime.complete(claim, "ch-1")
    assert _types(h, run_id)[-2:] == ["WorkflowCancelled", "ActivityCompleted"]
    assert h.runtime.claim(run_id, "1", 2) is None  # the abandoned retry never runs
    assert h.describe(run_id).status == "CANCELLED"
    # an attempt that never started records nothing after the cancel
    other = h.start_workflow("pg_late_checkout", {"tag": tag, "n": 2})
    h.runtime.run_decision(other)
    first = h.runtime.claim(other, "1", 1)
    assert h.runtime.fail(first, "ConnectionError", "flaky") == "retry"
    with h.store.begin() as tx:
        tasks.redispatch_next_attempt(tx, other, "1", utcnow())
    h.cancel_workflow_execution(other, "stop")
    h.runtime.complete(dataclasses.replace(first, attempt=2), "never ran")
    assert "ActivityCompleted" not in _types(h, other)
