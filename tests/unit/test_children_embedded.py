"""Child workflows and continue-as-new end to end on the embedded SQLite app (one process; the
real-service tests are tests/integration/test_children.py): the child's row and WorkflowStarted
written in the parent's transaction, its close delivered through its notice, parent-close
policies, a chain followed by result() and routing, and the derived ids."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from harvest_celery import (
    ChildWorkflowFailed,
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ForksHoldCopies,
    Harvest,
    RetryPolicy,
    Saga,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._core.ids import MAX_ID_LENGTH, check_execution_id
from harvest_celery._store.schema import child_notices


@activity(retry=RetryPolicy(max_attempts=1))
def book(trip):
    if trip == "nowhere":
        raise RuntimeError("no rooms")
    return f"booking-{trip}"


@activity
def unbook(booking):
    return f"unbooked-{booking}"


@workflow
async def book_trip(ctx: WorkflowContext, trip):
    saga = Saga(ctx)
    ref = await saga.step(lambda: ctx.execute_activity(book, trip), lambda b: ctx.execute_activity(unbook, b))
    return {"ref": ref}


@workflow
async def checkout(ctx: WorkflowContext, trip):
    try:
        return await ctx.execute_child_workflow(book_trip, trip)
    except ChildWorkflowFailed as exc:
        return {"failed": exc.child_id, "status": exc.status, "error": exc.error}


@workflow
async def waits(ctx: WorkflowContext, _):
    return await ctx.wait_signal("go")


@workflow
async def leaves(ctx: WorkflowContext, policy):
    handle = ctx.start_child_workflow(waits, None, parent_close_policy=policy)
    return handle.id


@workflow
async def takes_id(ctx: WorkflowContext, child_id):
    try:
        await ctx.execute_child_workflow(waits, None, id=child_id)
    except ExecutionAlreadyExists:
        return "refused"
    return "started"


@workflow
async def counter(ctx: WorkflowContext, n):
    if n < 5:
        ctx.continue_as_new(n + 1)
    return n + await ctx.wait_signal("last")


@workflow
async def hands_on(ctx: WorkflowContext, policy):
    if policy != "done":
        ctx.start_child_workflow(waits, None, parent_close_policy=policy)
        ctx.continue_as_new("done")
    return await ctx.wait_signal("end")


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(
        book, unbook, book_trip, checkout, waits, leaves, takes_id, counter, hands_on
    )
    harvest.migrate()
    return harvest


def test_a_child_runs_and_its_result_reaches_the_parent_once(h):
    h.start_workflow("checkout", "rome", execution_id="order-1")
    assert h.result("order-1") == {"ref": "booking-rome"}
    parent, child = h.describe("order-1"), h.describe("order-1-c1")
    assert child.parent_id == "order-1" and child.status == "COMPLETED"
    assert parent.children == ({"id": "order-1-c1", "workflow": "book_trip", "status": "COMPLETED"},)
    types = [e.event.type for e in h.history("order-1")]
    assert types.count("ChildWorkflowClosed") == 1 and types.index("ChildWorkflowStarted") == 2
    with h.store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(child_notices)).scalar() == 0


def test_a_failed_child_raises_child_workflow_failed_in_the_parent(h):
    h.start_workflow("checkout", "nowhere", execution_id="order-2")
    answer = h.result("order-2")
    assert answer["failed"] == "order-2-c1" and answer["status"] == "FAILED"
    assert "no rooms" in answer["error"]


@pytest.mark.parametrize(("policy", "status"), [("terminate", "TERMINATED"), ("abandon", "RUNNING")])
def test_the_parent_close_policy_applies_when_the_parent_completes(h, policy, status):
    h.start_workflow("leaves", policy, execution_id=f"p-{policy}")
    child = h.result(f"p-{policy}")
    assert h.describe(child).status == status


def test_request_cancel_policy_asks_the_child_to_cancel(h):
    h.start_workflow("leaves", "request_cancel", execution_id="p-rc")
    child = h.result("p-rc")
    assert h.describe(child).cancel_requested_at is not None


def test_a_user_id_that_exists_is_refused_and_recorded_once(h):
    h.start_workflow("waits", None, execution_id="taken")
    h.start_workflow("takes_id", "taken", execution_id="asks")
    assert h.result("asks") == "refused"
    assert [e.event.type for e in h.history("asks")].count("ChildWorkflowStartRefused") == 1
    assert h.describe("taken").parent_id is None


def test_a_chain_is_followed_by_result_and_a_signal_to_the_first_id_reaches_the_current_run(h):
    first = "c" * MAX_ID_LENGTH
    h.start_workflow("counter", 0, execution_id=first)
    h.signal(first, "last", 100)  # routed along the chain to the run that waits
    assert h.result(first) == 105
    ids = [first]
    while h.describe(ids[-1]).continued_to:
        ids.append(h.describe(ids[-1]).continued_to)
    assert len(ids) == 6 and all(check_execution_id(i) == i for i in ids)
    assert [h.describe(i).status for i in ids] == ["CONTINUED_AS_NEW"] * 5 + ["COMPLETED"]
    assert h.describe(ids[1]).continued_from == first


@pytest.mark.parametrize(
    ("action", "expect"),
    [
        (lambda h, i: h.cancel_workflow_execution(i, "ops"), "CANCELLED"),
        (lambda h, i: h.terminate(i, "ops"), "TERMINATED"),
        (lambda h, i: h.request_cancellation(i, "ops"), "RUNNING"),  # asked; it waits on, uncancellable
    ],
    ids=["cancel", "terminate", "request_cancellation"],
)
def test_a_cancel_or_terminate_addressed_to_the_first_id_reaches_the_chains_current_run(h, action, expect):
    h.start_workflow("counter", 0, execution_id="route")
    ids = _chain(h, "route")
    assert len(ids) == 6 and h.describe(ids[-1]).status == "RUNNING"
    action(h, "route")
    last = h.describe(ids[-1])
    assert last.status == expect and (expect != "RUNNING" or last.cancel_requested_at is not None)
    assert [h.describe(i).status for i in ids[:-1]] == ["CONTINUED_AS_NEW"] * 5  # earlier links untouched


@pytest.mark.parametrize(("policy", "status"), [("terminate", "TERMINATED"), ("abandon", "RUNNING")])
def test_continue_as_new_applies_the_parent_close_policy_to_open_children(h, policy, status):
    h.start_workflow("hands_on", policy, execution_id=f"can-{policy}")
    first = h.describe(f"can-{policy}")
    assert first.status == "CONTINUED_AS_NEW" and len(first.children) == 1
    assert h.describe(first.children[0]["id"]).status == status
    assert h.describe(first.continued_to).status == "RUNNING"  # the next link carries no child


def _chain(h, first):
    ids = [first]
    while h.describe(ids[-1]).continued_to:
        ids.append(h.describe(ids[-1]).continued_to)
    return ids


def test_erasing_one_link_of_a_chain_or_a_parent_is_refused_unless_with_forks(h):
    h.start_workflow("counter", 0, execution_id="e")
    h.signal("e", "last", 1)
    ids = _chain(h, "e")
    with pytest.raises(ForksHoldCopies) as refused:
        h.erase_payloads("e")
    assert refused.value.forks == ids[1:]
    assert h.erase_payloads(ids[2], with_forks=True)["forks"] == sorted(set(ids) - {ids[2]})
    h.start_workflow("checkout", "oslo", execution_id="par")
    h.result("par")
    with pytest.raises(ForksHoldCopies):
        h.erase_payloads("par")  # its child holds a copy of its input
    with pytest.raises(ForksHoldCopies):
        h.erase_payloads("par-c1")


def test_purge_takes_a_chain_only_as_a_whole_once_its_last_run_is_terminal(h):
    h.start_workflow("counter", 0, execution_id="pg")
    ids = _chain(h, "pg")
    assert h.describe(ids[-1]).status == "RUNNING" and len(ids) == 6
    assert h.purge(0)["runs"] == 0  # five terminal links, but the chain is open
    assert h.describe("pg").status == "CONTINUED_AS_NEW"
    h.signal("pg", "last", 1)
    assert h.result("pg") == 6
    assert h.purge(0)["runs"] == 6
    with pytest.raises(ExecutionNotFound):
        h.describe("pg")


def test_harvest_replay_reads_histories_holding_every_new_event_type(h):
    from harvest_celery.replay import WorkflowReplayer

    h.start_workflow("checkout", "rome", execution_id="rp")  # Scheduled, Started, Closed
    h.start_workflow("waits", None, execution_id="rp-taken")
    h.start_workflow("takes_id", "rp-taken", execution_id="rp-asks")  # StartRefused
    h.start_workflow("counter", 3, execution_id="rp-chain")  # WorkflowContinuedAsNew
    h.signal("rp-chain", "last", 1)
    h.result("rp-chain")
    held = {e.event.type for r in ("rp", "rp-asks", "rp-chain") for e in h.history(r)}
    assert {
        "ChildWorkflowScheduled",
        "ChildWorkflowStarted",
        "ChildWorkflowStartRefused",
        "ChildWorkflowClosed",
        "WorkflowContinuedAsNew",
    } <= held
    report = WorkflowReplayer(h).replay_database()
    assert report.passed, [r.line() for r in report.runs if r.result != "ok"]
