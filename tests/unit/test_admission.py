"""Workflow admission (``_store.admission``) on the embedded SQLite store, messages delivered by
hand: a limited workflow's run past its limit is written waiting (no decision request, no
decision message); every decision path refuses it; the close of an admitted run admits the next
in start order (priority first); signals, cancels and terminates of a waiting run; keys copied by
a reset; the key tombstoned by erasure; bad input writes nothing."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from harvest_celery import Harvest, InvalidLimitKey, WorkflowContext, activity, workflow
from harvest_celery._core.admission import admission_text, declare_admission, ordinal
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._store import admission as store_admission
from harvest_celery._store import starts
from harvest_celery._store.records import RunRow, TaskRow, utcnow
from harvest_celery._store.schema import events, executions, limits

PROBED: list[str] = []


@activity(name="adm_probe")
def adm_probe(label):
    PROBED.append(label)
    return label


@workflow(name="per_customer", concurrency=1, limit_key=lambda i: i["customer"])
async def per_customer(ctx: WorkflowContext, data):
    await ctx.execute_activity(adm_probe, data["label"])
    got = await ctx.wait_signal("go")
    return {"label": data["label"], "signal": got, "priority": ctx.info.priority}


@workflow(name="global_two", concurrency=2)
async def global_two(ctx: WorkflowContext, data):
    return await ctx.wait_signal("go")


@workflow(name="free_run")
async def free_run(ctx: WorkflowContext, data):
    return await ctx.wait_signal("go")


@workflow(name="chained", concurrency=1, limit_key=lambda i: i["customer"])
async def chained(ctx: WorkflowContext, data):
    if data["n"] < 2:
        ctx.continue_as_new({**data, "n": data["n"] + 1})
    return {"n": data["n"], "priority": ctx.info.priority, "signal": await ctx.wait_signal("go")}


@workflow(name="bad_key", concurrency=1, limit_key=lambda i: i["missing"])
async def bad_key(ctx: WorkflowContext, data):
    return data


@workflow(name="int_key", concurrency=1, limit_key=lambda i: 7)
async def int_key(ctx: WorkflowContext, data):
    return data


@pytest.fixture
def h(tmp_path):
    PROBED.clear()
    harvest = Harvest(f"sqlite:///{tmp_path / 'h.db'}").register(
        per_customer, global_two, free_run, bad_key, int_key, adm_probe, chained
    )
    harvest.migrate()
    harvest._inline = None  # deliver messages by hand
    harvest.runtime.dispatcher = InlineDispatcher()
    yield harvest
    assert_in_use_matches(harvest)


def assert_in_use_matches(h):
    """Each workflow limit row's in_use is its admitted RUNNING runs (after a settle)."""
    with h.store.begin() as tx:
        for row in tx.conn.execute(
            sa.select(limits).where(limits.c.name.in_(["per_customer", "global_two", "chained"]))
        ):
            holding = tx.conn.execute(
                sa.select(sa.func.count()).where(
                    (executions.c.workflow_type == row.name)
                    & (executions.c.limit_digest == row.key_digest)
                    & executions.c.admitted_at.is_not(None)
                    & (executions.c.status == "RUNNING")
                )
            ).scalar_one()
            assert row.in_use <= holding or holding == 0 and row.in_use == 0, (row.name, row.in_use, holding)


def decisions(h):
    """The run ids of the decision messages queued (taken out of the queue)."""
    queue = h.runtime.dispatcher.queue
    ids = [m.args[0] for m in queue if m.task_name == "harvest.decide"]
    kept = [m for m in queue if m.task_name != "harvest.decide"]
    queue.clear()
    queue.extend(kept)
    return ids


def drain(h):
    """Deliver every message, decisions and activities, until the queue is empty."""
    queue = h.runtime.dispatcher.queue
    while queue:
        m = queue.popleft()
        if m.task_name == "harvest.decide":
            h.runtime.run_decision(m.args[0])
        else:
            claim = h.runtime.claim(*m.args)
            if claim is not None:
                h.runtime.execute(claim, h.registry.activity(m.task_name).fn)


def row(h, run_id):
    with h.store.begin() as tx:
        return tx.lock(run_id)


def history_types(h, run_id):
    return [e.event.type for e in h.store.history(run_id)]


def counts(h):
    with h.store.begin() as tx:
        runs = tx.conn.execute(sa.select(sa.func.count()).select_from(executions)).scalar_one()
        evs = tx.conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
    return runs, evs


def start(h, label, customer="A", **kw):
    return h.start_workflow("per_customer", {"label": label, "customer": customer}, label, **kw)


# ── bad input: a specific error, nothing written ─────────────────────────────────────────────
@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_concurrency_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        workflow(concurrency=value)


def test_limit_key_must_be_callable_and_needs_a_limit():
    with pytest.raises(TypeError, match="limit_key must be callable"):
        workflow(concurrency=1, limit_key="customer")
    with pytest.raises(ValueError, match="limit_key without a limit"):
        workflow(limit_key=lambda i: "k")
    assert declare_admission().limited is False


@pytest.mark.parametrize("priority", [10, -1, "9", True])
def test_a_bad_priority_is_refused_and_writes_nothing(h, priority):
    before = counts(h)
    with pytest.raises(ValueError, match="priority must be an int from 0 to 9"):
        start(h, "p", priority=priority)
    with pytest.raises(ValueError, match="priority must be an int from 0 to 9"):
        h.start_workflow("free_run", None, "free", priority=priority)
    assert counts(h) == before


@pytest.mark.parametrize(("name", "reason"), [("bad_key", "raised KeyError"), ("int_key", "returned int")])
def test_a_bad_limit_key_refuses_the_start_with_no_run_and_no_event(h, name, reason):
    before = counts(h)
    with pytest.raises(InvalidLimitKey, match=f"invalid limit key for workflow '{name}'.*{reason}"):
        h.start_workflow(name, {"customer": "A"}, "k1")
    with pytest.raises(InvalidLimitKey):
        h.signal_with_start(name, {"customer": "A"}, "k2", "go")
    assert counts(h) == before


def test_a_key_over_200_characters_is_refused(h):
    with pytest.raises(InvalidLimitKey, match="over 200"):
        start(h, "long", customer="x" * 201)
    assert counts(h) == (0, 0)


# ── admission on start and on close ──────────────────────────────────────────────────────────
def test_past_its_limit_a_run_waits_with_no_decision_request(h):
    a1, a2, b1 = start(h, "a1"), start(h, "a2"), start(h, "b1", customer="B")
    assert sorted(decisions(h)) == ["a1", "b1"]
    waiting = row(h, a2)
    assert waiting.waiting and waiting.decision_requested_at is None and not waiting.decidable
    assert not row(h, a1).waiting and not row(h, b1).waiting
    assert row(h, a1).limit_digest == waiting.limit_digest != row(h, b1).limit_digest
    h.runtime.run_decision(a2)  # a stray decision message decides nothing
    assert history_types(h, a2) == ["WorkflowStarted"]


def test_an_unlimited_workflow_is_admitted_at_start_as_today(h):
    run = h.start_workflow("free_run", None, "free", priority=4)
    assert decisions(h) == []  # admitted: its start took its first decision (eager_start)
    found = row(h, run)
    assert found.admitted_at is not None and found.limit_digest is None and found.priority == 4


def test_the_close_of_an_admitted_run_admits_the_next_in_start_order(h):
    for label in ("a1", "a2", "a3", "a4"):
        start(h, label)
    drain(h)
    assert PROBED == ["a1"]  # only the admitted run's code ran
    for expected in ("a1", "a2", "a3"):
        h.signal(expected, "go", expected)
        drain(h)  # its close admits the next; that one's decision runs its probe
        assert h.describe(expected).status == "COMPLETED"
    assert PROBED == ["a1", "a2", "a3", "a4"]
    assert row(h, "a4").decidable


def test_a_signal_to_a_waiting_run_is_appended_and_decides_nothing_until_admitted(h):
    start(h, "a1")
    start(h, "a2")
    drain(h)
    h.signal("a2", "go", "early")
    assert decisions(h) == []
    assert history_types(h, "a2") == ["WorkflowStarted", "SignalReceived"]
    assert row(h, "a2").decision_requested_at is None and PROBED == ["a1"]
    h.signal("a1", "go", "x")
    drain(h)
    assert h.describe("a2").status == "COMPLETED"
    assert h.result("a2", timeout=1)["signal"] == "early"  # the first decision saw it


def test_signal_with_start_that_creates_a_waiting_run_holds_its_signal(h):
    start(h, "a1")
    h.signal_with_start("per_customer", {"label": "a2", "customer": "A"}, "a2", "go", "held")
    assert decisions(h) == ["a1"]
    assert history_types(h, "a2") == ["WorkflowStarted", "SignalReceived"]
    assert row(h, "a2").waiting


@pytest.mark.parametrize(
    ("action", "status"),
    [("cancel", "CANCELLED"), ("request_cancellation", "CANCELLED"), ("terminate", "TERMINATED")],
)
def test_cancel_cooperative_cancel_and_terminate_close_a_waiting_run_with_no_decision(h, action, status):
    for label in ("a1", "a2", "a3"):
        start(h, label)
    drain(h)
    getattr(h, action if action != "cancel" else "cancel_workflow_execution")("a2", "no longer")
    assert decisions(h) == []
    closed = row(h, "a2")
    assert closed.status == status and closed.decision_requested_at is None
    assert h.describe("a2").closed_at is not None
    types = history_types(h, "a2")
    assert "SignalReceived" not in types and types[0] == "WorkflowStarted"
    assert ("WorkflowCancelled" in types) == (status == "CANCELLED")
    h.signal("a1", "go", "x")
    drain(h)
    assert PROBED == ["a1", "a3"]  # a2's code never ran; a3 kept its place


def test_priority_orders_the_waiting_runs_of_a_key(h):
    start(h, "hold")
    for i in range(3):
        start(h, f"p0-{i}")
    start(h, "p9", priority=9)
    drain(h)
    h.signal("hold", "go", "x")
    drain(h)
    assert PROBED == ["hold", "p9"]
    assert h.result  # the run sees its own start priority
    h.signal("p9", "go", "x")
    drain(h)
    assert h.result("p9", timeout=1)["priority"] == 9
    assert PROBED == ["hold", "p9", "p0-0"]


def test_a_paused_waiting_run_keeps_its_place_but_is_passed_over(h):
    for label in ("a1", "a2", "a3"):
        start(h, label)
    drain(h)
    h.pause("a2")
    h.signal("a1", "go", "x")
    drain(h)
    assert PROBED == ["a1", "a3"] and row(h, "a2").waiting
    h.resume("a2")  # still waiting: a3 holds the slot, so resume requests no decision
    assert decisions(h) == [] and row(h, "a2").decision_requested_at is None
    h.signal("a3", "go", "x")
    drain(h)
    assert PROBED == ["a1", "a3", "a2"]


def test_a_global_limit_admits_n_at_once(h):
    for i in range(3):
        h.start_workflow("global_two", None, f"g{i}")
    assert [m.args[0] for m in h.runtime.dispatcher.queue] == ["g0", "g1"]
    drain(h)
    h.signal("g0", "go", 1)
    drain(h)
    assert not row(h, "g2").waiting


# ── every decision path refuses a waiting run ────────────────────────────────────────────────
def test_request_decision_take_started_and_stale_decisions_refuse_a_waiting_run(h):
    from datetime import timedelta

    from harvest_celery._store import sweeps
    from harvest_celery._store.records import Timings

    start(h, "a1")
    start(h, "a2")
    drain(h)
    now = utcnow()
    with h.store.begin() as tx:
        tx.request_decision("a2", now, "harvest", force=True)
        assert starts.take_started(tx, [("a2", now)], now, "harvest", admit=False) == 0
        sweeps.stale_decisions(tx, now + timedelta(hours=1), Timings(), "harvest")
        assert not [d for d in tx.dispatches if d.execution_id == "a2"]
    assert row(h, "a2").decision_requested_at is None


def test_the_append_choke_point_requests_no_decision_for_a_waiting_run(h):
    """``Tx.append(decide_on=)``: what fire_timer, signal, request_cancellation, tasks.fail,
    starts.start and fork_dag_run request their decisions through."""
    from harvest_celery._core import events as ev

    start(h, "a1")
    start(h, "a2")
    drain(h)
    with h.store.begin() as tx:
        waiting = tx.lock("a2")
        assert waiting.waiting
        tx.append(waiting, [ev.SignalReceived("go", 1)], utcnow(), decide_on="harvest")
        assert not [d for d in tx.dispatches if d.execution_id == "a2"]
        admitted = tx.lock("a1")
        tx.append(admitted, [ev.SignalReceived("other", 1)], utcnow(), decide_on="harvest")
        assert [d.execution_id for d in tx.dispatches] == ["a1"]  # an admitted run does decide
    assert row(h, "a2").decision_requested_at is None
    assert history_types(h, "a2")[-1] == "SignalReceived"


def test_the_predicates_refuse_a_waiting_row():
    from harvest_celery._store import predicates as p

    waiting = dataclasses.replace(RunRow.assumed("r", "W", 3, None), admitted_at=None)
    assert not waiting.decidable and waiting.waiting
    task = TaskRow("r", "a1", "act", "q", "running", 1, None, None, 2, False, None)
    refused = p.fast_path.refusing(waiting, task, next_seq=3, sticky_queue=None, attempt=1)
    assert [t.name for t in refused] == ["admitted"]
    assert "admitted_at IS NOT NULL" in p.fast_path.sql()


# ── keys: copied by a reset, tombstoned by erasure ───────────────────────────────────────────
def test_a_reset_copies_the_key_and_waits_in_line(h):
    start(h, "a1")
    drain(h)
    h.terminate("a1", "to reset")
    start(h, "a2")
    drain(h)
    new = h.reset("a1", 1, "a1-reset")
    assert row(h, new).limit_digest == row(h, "a1").limit_digest
    assert row(h, new).waiting  # a2 holds the slot
    h.signal("a2", "go", "x")
    drain(h)
    assert not row(h, new).waiting


def test_erasure_of_a_closed_run_tombstones_its_key(h):
    start(h, "a1")
    drain(h)
    with h.store.begin() as tx:
        assert h.store.payloads.decode_value(tx.lock("a1", payloads=True).limit_key) == "A"
    h.terminate("a1", "done")
    h.erase_payloads("a1")
    with h.store.begin() as tx:
        stored = tx.conn.execute(sa.select(executions.c.limit_key).where(executions.c.id == "a1")).scalar()
    assert stored != "A" and "A" not in str(stored)


# ── visibility: the position ─────────────────────────────────────────────────────────────────
def test_a_waiting_runs_position(h):
    for label in ("a1", "a2", "a3"):
        start(h, label)
    with h.store.begin() as tx:
        place = store_admission.waiting_position(tx.conn, "a3")
        assert store_admission.waiting_position(tx.conn, "a1") is None
    assert (place["position"], place["waiting"], place["in_use"], place["concurrency"]) == (2, 2, 1, 1)
    assert admission_text(place) == "waiting for admission to per_customer: 2nd of 2 waiting; 1/1 in use"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 21, 102)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "21st",
        "102nd",
    ]


# ── operators: set_limit on a workflow name ──────────────────────────────────────────────────
def test_set_limit_raises_and_lowers_a_workflows_admission_limit(h):
    for i in range(4):
        h.start_workflow("global_two", None, f"g{i}")
    drain(h)
    h.set_limit("global_two", concurrency=3)  # raised: the next is admitted in the same write
    assert not row(h, "g2").waiting and row(h, "g3").waiting
    h.set_limit("global_two", concurrency=1)  # lowered: no admitted run stops
    drain(h)
    h.signal("g0", "go", 1)
    drain(h)
    assert row(h, "g3").waiting  # 2 still hold slots of a limit of 1
    h.set_limit("global_two", clear=True)  # back to the declared 2
    h.signal("g1", "go", 1)
    drain(h)
    assert not row(h, "g3").waiting


def test_set_limit_refuses_a_rate_limit_or_an_ambiguous_name_for_a_workflow(h):
    h.start_workflow("global_two", None, "g0")
    with pytest.raises(ValueError, match="rate_limit is refused for workflow 'global_two'"):
        h.set_limit("global_two", rate_limit="5/s")

    @activity(name="global_two")
    def clash(x):
        return x

    h.registry.activities["global_two"] = clash.__harvest_activity__
    with pytest.raises(ValueError, match="both an activity and a workflow.*activity 'global_two', workflow"):
        h.set_limit("global_two", concurrency=1)


def test_the_admission_gauges_are_read_from_postgres(h):
    from harvest_celery._runtime.metrics import _SPECS, FROM_POSTGRES, exposition

    assert _SPECS["admission_waiting"][2] == ("workflow",) and "admission_in_use" in FROM_POSTGRES
    for label in ("a1", "a2", "a3"):
        start(h, label)
    text = exposition()[0].decode()
    assert 'harvest_admission_waiting{workflow="per_customer"} 2.0' in text
    assert 'harvest_admission_in_use{workflow="per_customer"} 1.0' in text


def test_describe_list_and_stuck_show_waiting(h):
    start(h, "a1")
    start(h, "a2")
    drain(h)
    h.pause("a1")
    x = h.describe("a2")
    assert x.display_status == "WAITING" and x.admission["position"] == 1
    assert [r.id for r in h.list(status="WAITING")] == ["a2"]
    (hint,) = h.stuck("a2")
    assert hint["kind"] == "admission" and hint["holders"] == [{"execution_id": "a1", "state": "paused"}]
    assert "slot held by run a1: paused" in hint["text"]


def test_a_continue_as_new_link_inherits_its_predecessors_slot(h):
    h.start_workflow("chained", {"customer": "A", "n": 0}, "c1", priority=3)
    h.start_workflow("chained", {"customer": "A", "n": 0}, "c2")
    drain(h)  # c1 continues twice; c2 waits behind the chain all along
    link = h.describe("c1").continued_to
    while h.describe(link).continued_to:
        link = h.describe(link).continued_to
    last, first, behind = row(h, link), row(h, "c1"), row(h, "c2")
    assert link != "c1" and not last.waiting and behind.waiting  # the slot went down the chain
    assert (last.limit_digest, last.priority) == (first.limit_digest, 3)
    with h.store.engine.connect() as conn:
        seqs = dict(
            conn.execute(
                sa.select(executions.c.id, executions.c.admission_seq).where(
                    executions.c.id.in_(["c1", link])
                )
            ).all()
        )
    assert seqs[link] == seqs["c1"]
    assert h.describe("c2").admission["in_use"] == 1
    h.signal(link, "go", "x")
    drain(h)
    assert h.result(link)["priority"] == 3  # the chain kept its start priority
    assert not row(h, "c2").waiting  # the chain's close freed the slot: c2 admitted


def test_a_run_that_times_out_while_waiting_closes_without_running_its_code(h):
    from datetime import timedelta

    from harvest_celery._store import sweeps

    start(h, "a1")
    start(h, "a2", execution_timeout=30)
    drain(h)
    with h.store.begin() as tx:
        assert (
            sweeps.expire_deadline(tx, "a2", utcnow() + timedelta(minutes=1), 0.0, "harvest") == "execution"
        )
    drain(h)
    closed = h.describe("a2")
    assert closed.status == "TIMED_OUT" and closed.closed_at is not None and closed.timeout == "execution"
    assert history_types(h, "a2") == ["WorkflowStarted", "WorkflowTimeoutRequested", "WorkflowCancelled"]
    assert PROBED == ["a1"]  # its code never ran
    assert row(h, "a1").decision_requested_at is None  # the holder is untouched
