"""Every way a run is created passes admission (docs/flow-control.md, "Workflow admission"), on
the embedded SQLite store with messages delivered by hand: a child workflow and a schedule's
tick of a limited workflow are written waiting past the limit and admitted in order; a child's
key is computed at its parent's decision (a bad one raises ``InvalidLimitKey`` into the parent,
nothing recorded); a reset whose new run waits holds its re-dispatched activities until it is
admitted. The same on real workers: tests/integration/test_admission.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from harvest_celery import (
    ChildWorkflowFailed,
    Harvest,
    InvalidLimitKey,
    InvalidSchedule,
    WorkflowContext,
    activity,
    workflow,
)
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import limits
from harvest_celery._store.schema import activity_tasks, events, executions, schedules

PROBED: list[str] = []


@activity(name="ap_probe")
def ap_probe(label):
    PROBED.append(label)
    return label


@workflow(name="ap_limited", concurrency=1, limit_key=lambda i: i["customer"])
async def ap_limited(ctx: WorkflowContext, data):
    await ctx.execute_activity(ap_probe, data["label"])
    got = await ctx.wait_signal("go")
    return {"label": data["label"], "signal": got, "priority": ctx.info.priority}


@workflow(name="ap_bad_key", concurrency=1, limit_key=lambda i: i["missing"])
async def ap_bad_key(ctx: WorkflowContext, data):
    return data


@workflow(name="ap_parent")
async def ap_parent(ctx: WorkflowContext, data):
    kids = [
        ctx.start_child_workflow(
            ap_limited, {"label": label, "customer": "A"}, id=label, **data.get("kw", {})
        )
        for label in data["labels"]
    ]
    return [(await kid)["label"] for kid in kids]


@workflow(name="ap_bad_parent")
async def ap_bad_parent(ctx: WorkflowContext, data):
    seen = []
    for start in (
        lambda: ctx.start_child_workflow(ap_bad_key, {"x": 1}),
        lambda: ctx.start_child_workflow(ap_limited, {"label": "p", "customer": "A"}, priority=10),
    ):
        try:
            start()
        except (InvalidLimitKey, ValueError) as exc:
            seen.append([type(exc).__name__, str(exc)])
    await ctx.execute_activity(ap_probe, "after")
    return seen


@workflow(name="ap_awaits_child")
async def ap_awaits_child(ctx: WorkflowContext, data):
    try:
        return await ctx.execute_child_workflow(ap_limited, {"label": data, "customer": "A"}, id=data)
    except ChildWorkflowFailed as exc:
        return {"failed": exc.child_id, "status": exc.status}


@pytest.fixture
def h(tmp_path):
    PROBED.clear()
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(
        ap_probe, ap_limited, ap_bad_key, ap_parent, ap_bad_parent, ap_awaits_child
    )
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    return harvest


def drain(h, *, activities: bool = True):
    """Deliver the queued messages until none is left (``activities=False``: decisions only;
    activity messages stay queued)."""
    queue = h.runtime.dispatcher.queue
    kept = []
    while queue:
        m = queue.popleft()
        if m.task_name == "harvest.decide":
            h.runtime.run_decision(m.args[0])
        elif not activities:
            kept.append(m)
        else:
            claim = h.runtime.claim(*m.args)
            if claim is not None:
                h.runtime.execute(claim, h.registry.activity(m.task_name).fn)
    queue.extend(kept)


def activity_messages(h, run_id):
    return [m for m in h.runtime.dispatcher.queue if m.task_name == "ap_probe" and m.args[0] == run_id]


def row(h, run_id):
    with h.store.begin() as tx:
        return tx.lock(run_id)


def start(h, label, customer="A", **kw):
    return h.start_workflow("ap_limited", {"label": label, "customer": customer}, label, **kw)


def count(h, table, *where):
    with h.store.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


# ── children ─────────────────────────────────────────────────────────────────────────────────
def test_a_child_past_its_limit_waits_and_is_admitted_in_order_as_slots_free(h):
    start(h, "holder")
    h.start_workflow("ap_parent", {"labels": ["k1", "k2"]}, "parent", priority=6)
    drain(h)
    assert PROBED == ["holder"]  # both children wait behind the holder; no child code ran
    k1, k2 = row(h, "k1"), row(h, "k2")
    assert k1.waiting and k2.waiting
    assert h.describe("k1").parent_id == "parent" == h.describe("k2").parent_id
    assert k1.decision_requested_at is None and k1.limit_digest == row(h, "holder").limit_digest
    assert (k1.priority, k2.priority) == (6, 6)  # the parent's priority
    assert h.describe("k2").admission["position"] == 2
    h.signal("holder", "go", "x")
    drain(h)
    assert PROBED == ["holder", "k1"] and row(h, "k2").waiting  # one slot: k1, then k2
    h.signal("k1", "go", "y")
    drain(h)
    assert PROBED == ["holder", "k1", "k2"]
    h.signal("k2", "go", "z")
    drain(h)
    assert h.result("parent") == ["k1", "k2"]  # the parent awaited its waiting children as usual


def test_a_childs_priority_given_at_start_orders_it_among_the_waiting_runs(h):
    start(h, "holder")
    start(h, "plain")  # waiting, priority 0, started first
    h.start_workflow("ap_parent", {"labels": ["urgent"], "kw": {"priority": 9}}, "parent")
    drain(h)
    assert row(h, "urgent").priority == 9 and h.describe("urgent").admission["position"] == 1
    h.signal("holder", "go", "x")
    drain(h)
    assert not row(h, "urgent").waiting and row(h, "plain").waiting


def test_a_bad_child_key_or_priority_raises_in_the_parent_and_records_nothing(h):
    h.start_workflow("ap_bad_parent", None, "bad")
    drain(h)
    seen = h.result("bad")
    assert [error for error, _ in seen] == ["InvalidLimitKey", "ValueError"]
    assert "ap_bad_key" in seen[0][1] and "KeyError" in seen[0][1] and "10" in seen[1][1]
    assert count(h, executions, executions.c.parent_id == "bad") == 0  # no child row
    types = [e.event.type for e in h.store.history("bad")]
    assert "ChildWorkflowScheduled" not in types and types[-1] == "WorkflowCompleted"
    assert PROBED == ["after"]


@pytest.mark.parametrize("action, status", [("terminate", "TERMINATED"), ("cancel", "CANCELLED")])
def test_a_waiting_child_closed_by_an_operator_fails_its_parents_await(h, action, status):
    start(h, "holder")
    h.start_workflow("ap_awaits_child", "kid", "parent")
    drain(h)
    assert row(h, "kid").waiting
    if action == "terminate":
        h.terminate("kid", "not needed")
    else:
        h.cancel_workflow_execution("kid", "not needed")
    drain(h)
    assert h.result("parent") == {"failed": "kid", "status": status}
    assert PROBED == ["holder"]  # the child's code never ran
    assert [e.event.type for e in h.store.history("kid")][0] == "WorkflowStarted"


# ── schedule ticks ───────────────────────────────────────────────────────────────────────────
def test_a_schedules_tick_and_trigger_of_a_limited_workflow_wait_for_admission(h):
    start(h, "holder")
    drain(h)
    h.create_schedule(
        "s", workflow="ap_limited", every=timedelta(hours=1), input={"label": "t", "customer": "A"}
    )
    tick = h.trigger_schedule("s", overlap="allow_all")
    assert tick is not None
    ticked = row(h, tick)
    assert ticked.waiting and ticked.limit_digest == row(h, "holder").limit_digest
    drain(h)
    assert PROBED == ["holder"]
    assert h.trigger_schedule("s") is None  # overlap "skip": the waiting tick counts open
    h.signal("holder", "go", "x")
    drain(h)
    assert PROBED == ["holder", "t"] and not row(h, tick).waiting


def test_a_schedule_whose_input_gives_a_bad_key_is_refused_at_create(h):
    with pytest.raises(InvalidSchedule, match="limit_key"):
        h.create_schedule("s", workflow="ap_bad_key", every=timedelta(hours=1), input={"x": 1})
    assert count(h, schedules) == 0


# ── a reset that must wait holds its re-dispatched activities ────────────────────────────────
def test_a_reset_that_waits_sends_its_open_activities_only_once_admitted(h):
    start(h, "a1")
    drain(h, activities=False)  # a1 admitted, its activity dispatched and still open
    start(h, "a2")  # waiting behind a1
    assert len(activity_messages(h, "a1")) == 1
    h.runtime.dispatcher.queue.clear()  # the source's message is lost: only the reset's counts
    new = h.reset("a1", 2, "a1-reset")  # a1 (live) terminated: a2 is next, the reset waits
    assert row(h, "a2").admitted_at is not None and row(h, new).waiting
    assert activity_messages(h, new) == []  # the bug: it was dispatched at once
    with h.store.engine.connect() as conn:
        held = conn.execute(sa.select(activity_tasks).where(activity_tasks.c.execution_id == new)).one()
    assert (held.status, held.limit_digest) == ("waiting", None)
    assert h.store.held_activities(new) == {held.activity_id: "held until the run is admitted"}
    under, _ = h.store.transaction(limits.waiting_limits)
    assert under == []  # a held row is under no limit: the sweeper's backstop settles nothing for it
    drain(h)
    assert PROBED == ["a2"]  # a2's code; nothing of the reset ran
    h.signal("a2", "go", "x")
    drain(h, activities=False)  # a2's close admits the reset: its held row is sent now
    assert not row(h, new).waiting and len(activity_messages(h, new)) == 1
    drain(h)
    assert PROBED == ["a2", "a1"]
    h.signal(new, "go", "y")
    drain(h)
    assert h.result(new)["label"] == "a1"
    assert count(h, events, events.c.execution_id == new, events.c.type == "ActivityStarted") == 1


def test_a_reset_admitted_at_once_sends_its_open_activities_at_once(h):
    start(h, "a1")
    drain(h, activities=False)
    h.runtime.dispatcher.queue.clear()
    new = h.reset("a1", 2, "a1-reset")  # the terminated source's slot is free: admitted now
    assert not row(h, new).waiting and len(activity_messages(h, new)) == 1
