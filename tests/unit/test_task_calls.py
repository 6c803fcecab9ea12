"""Adopted tasks called durably Celery's way (issue 22), without services: the invocation built
from arguments or from a Celery signature, the call options (honoured, dropped, refused),
``ctx.execute_task`` in the pure engine (what it records, what it refuses before recording,
divergence against ``execute_activity``), the event field, and the message it becomes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from celery import Celery, signature

from harvest_celery import InvalidTaskCall, PayloadNotSerializable, PayloadTooLarge, UnknownActivity, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.commands import ScheduleActivity
from harvest_celery._core.invocation import (
    DROPPED_OPTIONS,
    REFUSED_OPTIONS,
    CallOptions,
    call_options,
    invocation,
    signature_call,
)
from harvest_celery._core.registry import ActivityDefinition
from harvest_celery._core.replay import EngineConfig
from harvest_celery._runtime.messages import REF_HEADER, encode
from harvest_celery._store.records import Dispatch
from harvest_celery.testing import Simulator

app = Celery("task_calls_unit", set_as_current=False)


@app.task(name="shop.add")
def add(x, y):
    return x + y


@app.task(name="shop.scale")
def scale(x, *, factor=2):
    return x * factor


NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
ADOPTED = SimpleNamespace(__harvest_activity__=ActivityDefinition("shop.add", None, "shop", adopted=True))
SCALE = SimpleNamespace(__harvest_activity__=ActivityDefinition("shop.scale", None, adopted=True))
NATIVE = SimpleNamespace(__harvest_activity__=ActivityDefinition("native", lambda x: x))


# ── the invocation ────────────────────────────────────────────────────────────────────────────
def test_an_invocation_reads_back_as_json_would():
    assert invocation("t", (1, (2, 3)), {"k": (4,)}) == {"args": [1, [2, 3]], "kwargs": {"k": [4]}}


def test_a_set_argument_is_refused_naming_its_position():
    with pytest.raises(PayloadNotSerializable) as info:
        invocation("t", (1, {2}), {})
    assert "argument 1 of task 't'" in str(info.value)


def test_a_non_string_kwargs_key_is_refused_naming_the_key():
    with pytest.raises(PayloadNotSerializable) as info:
        invocation("t", (), {1: "x"})
    assert (
        str(info.value)
        == "keyword argument 1 of task 't' is not JSON-serialisable: a kwargs key must be a string"
    )


def test_a_bad_kwarg_value_is_refused_naming_the_key():
    with pytest.raises(PayloadNotSerializable, match="keyword argument 'when' of task 't'"):
        invocation("t", (), {"when": object()})


# ── signatures ────────────────────────────────────────────────────────────────────────────────
def test_a_partial_signature_gets_the_previous_result_and_extra_args_prepended():
    name, args, kwargs, options = signature_call(add.s(2).set(queue="q"), (1,), {"z": 3}, previous=0)
    assert (name, args, kwargs, options) == ("shop.add", [0, 1, 2], {"z": 3}, {"queue": "q"})


def test_call_time_kwargs_are_merged_over_the_signature_s():
    _, args, kwargs, _ = signature_call(scale.s(3, factor=4), (), {"factor": 5, "other": 1})
    assert args == [3] and kwargs == {"factor": 5, "other": 1}


def test_an_immutable_signature_keeps_its_args():
    assert signature_call(add.si(1, 2))[:3] == ("shop.add", [1, 2], {})


@pytest.mark.parametrize("extra", [{"args": (1,)}, {"kwargs": {"y": 1}}, {"previous": 7}])
def test_an_immutable_signature_given_more_arguments_is_refused(extra):
    with pytest.raises(InvalidTaskCall) as info:
        signature_call(add.si(1, 2), **extra)
    assert info.value.option == "immutable"
    assert "immutable signature of task 'shop.add'" in str(info.value)
    assert isinstance(info.value, ValueError)


# ── options ───────────────────────────────────────────────────────────────────────────────────
def test_honoured_options():
    assert call_options({"queue": "q"}) == CallOptions("q")
    assert call_options({"countdown": 30}) == CallOptions(countdown=30.0)
    eta = datetime(2026, 2, 1, tzinfo=timezone.utc)
    assert call_options({"eta": eta}) == CallOptions(eta=eta)


def test_dropped_and_ignored_options_change_nothing():
    options = {name: "x" for name in DROPPED_OPTIONS} | {"ignore_result": True}
    assert call_options(options) == CallOptions()


@pytest.mark.parametrize("name", sorted(REFUSED_OPTIONS))
def test_each_refused_option_is_refused_by_name(name):
    with pytest.raises(InvalidTaskCall) as info:
        call_options({name: 1})
    assert info.value.option == name
    assert str(info.value) == f"call option {name!r} is refused: {REFUSED_OPTIONS[name]}"


def test_an_unknown_option_is_refused():
    with pytest.raises(InvalidTaskCall, match="call option 'shadow' is not supported") as info:
        call_options({"shadow": "x"})
    assert info.value.option == "shadow"


def test_a_naive_eta_is_refused():
    with pytest.raises(InvalidTaskCall, match="eta must be a timezone-aware datetime") as info:
        call_options({"eta": datetime(2026, 2, 1)})
    assert info.value.option == "eta"


def test_countdown_with_eta_is_refused():
    with pytest.raises(InvalidTaskCall, match="countdown and eta cannot be given together") as info:
        call_options({"countdown": 1, "eta": NOW})
    assert info.value.option == "countdown"


def test_a_negative_countdown_is_refused():
    with pytest.raises(InvalidTaskCall, match="countdown must be a non-negative number") as info:
        call_options({"countdown": -1})
    assert info.value.option == "countdown"


# ── ctx.execute_task in the engine ────────────────────────────────────────────────────────────
@workflow(name="calls")
async def calls(ctx, x):
    total = await ctx.execute_task(add, x, (1, 2)[0])
    return await ctx.execute_task("shop.scale", total, factor=3, queue="fast")


@workflow(name="as_activity")
async def as_activity(ctx, x):
    return await ctx.execute_activity("shop.add", {"args": [x, 1], "kwargs": {}})


def _scheduled(run):
    return [e for e in run.events if isinstance(e, ev.ActivityScheduled)]


def test_execute_task_records_the_call_and_its_convention():
    run = Simulator(calls, ADOPTED, SCALE).start("calls", 4)
    decision = run.decide()
    assert decision.commands == [
        ScheduleActivity(
            "1", "shop.add", {"args": [4, 1], "kwargs": {}}, "shop", call_convention="args_kwargs"
        )
    ]
    run.complete("1", 5)
    run.decide()
    second = _scheduled(run)[1]
    assert second.input == {"args": [5], "kwargs": {"factor": 3}}
    assert second.queue == "fast" and second.call_convention == "args_kwargs"
    run.complete("2", 15)
    run.decide()
    assert run.status == "COMPLETED" and run.events[-1].result == 15


def test_execute_activity_of_an_adopted_task_records_no_convention():
    run = Simulator(as_activity, ADOPTED).start("as_activity", 1)
    run.decide()
    (scheduled,) = _scheduled(run)
    assert scheduled.call_convention is None and "call_convention" not in scheduled.to_data()


def test_a_change_between_execute_activity_and_execute_task_is_a_divergence():
    recorded = Simulator(as_activity, ADOPTED).start("as_activity", 4)
    recorded.decide()

    @workflow(name="as_activity")
    async def as_task(ctx, x):
        return await ctx.execute_task("shop.add", x, 1)

    decision = Simulator(as_task, ADOPTED).run_from_history("as_activity", recorded.events).replay()
    assert decision.nd is not None
    assert decision.nd["expected"] == "ActivityScheduled(shop.add, task call)"
    assert decision.nd["actual"] == "ActivityScheduled(shop.add)"


def _refused(body, *objects, config=None):
    @workflow(name="bad")
    async def bad(ctx, _):
        return await body(ctx)

    run = Simulator(bad, ADOPTED, NATIVE, *objects, config=config).start("bad", None)
    decision = run.decide()
    assert not [c for c in decision.commands if isinstance(c, ScheduleActivity)]
    assert run.status == "FAILED"
    return run


@pytest.mark.parametrize(
    ("body", "error", "text"),
    [
        (lambda ctx: ctx.execute_task("shop.nope", 1), "UnknownActivity", "harvest.adopt_task"),
        (lambda ctx: ctx.execute_task("native", 1), "UnknownActivity", "harvest.adopt_task"),
        (lambda ctx: ctx.execute_task(object(), 1), "UnknownActivity", "is not a Celery task"),
        (lambda ctx: ctx.execute_task(add.s(1, 2)), "InvalidTaskCall", "not a signature"),
        (
            lambda ctx: ctx.execute_task(add, {1}, 2),
            "PayloadNotSerializable",
            "argument 0 of task 'shop.add'",
        ),
        (
            lambda ctx: ctx.execute_task(add, 1, **{"y": {2}}),
            "PayloadNotSerializable",
            "keyword argument 'y'",
        ),
        (lambda ctx: ctx.execute_task(add, "x" * 200, 1), "PayloadTooLarge", "over the cap of 100 bytes"),
    ],
)
def test_execute_task_refuses_before_recording(body, error, text):
    run = _refused(body, config=EngineConfig(max_activity_input_bytes=100))
    failed = run.events[-1]
    assert isinstance(failed, ev.WorkflowFailed)
    assert failed.error_type == error and text in failed.message


def test_execute_task_raises_the_errors_as_themselves():
    caught = []

    @workflow(name="probe")
    async def probe(ctx, _):
        for call in (
            lambda: ctx.execute_task("shop.nope"),
            lambda: ctx.execute_task(add.si(1, 2)),
            lambda: ctx.execute_task(add, {1}, 1),
        ):
            try:
                call()
            except (UnknownActivity, InvalidTaskCall, PayloadNotSerializable, PayloadTooLarge) as exc:
                caught.append(type(exc).__name__)
        return caught

    run = Simulator(probe, ADOPTED).start("probe", None)
    run.decide()
    assert run.events[-1].result == ["UnknownActivity", "InvalidTaskCall", "PayloadNotSerializable"]


def test_execute_task_refuses_on_a_schema_older_than_the_convention():
    run = _refused(lambda ctx: ctx.execute_task(add, 1, 2), config=EngineConfig(task_calls=False))
    assert run.events[-1].error_type == "InvalidTaskCall"
    assert "older than the call convention (migration 0008)" in run.events[-1].message


# ── the event and the message ─────────────────────────────────────────────────────────────────
def test_the_convention_round_trips_through_the_stored_event():
    event = ev.ActivityScheduled("1", "shop.add", {"args": [1], "kwargs": {}}, "q", False, "args_kwargs")
    assert ev.event_from_data(event.to_data()) == event
    plain = ev.ActivityScheduled("1", "shop.add", {"args": [1], "kwargs": {}}, "q")
    assert ev.event_from_data(plain.to_data()).call_convention is None


def test_a_task_call_is_the_message_s_own_args_and_kwargs():
    call = {"args": [1, 2], "kwargs": {"factor": 3}}
    message = encode(
        Dispatch(Dispatch.ACTIVITY, "r", "q", "1", "shop.add", 2, True, call, call_convention="args_kwargs")
    )
    assert (message.args, message.kwargs) == ([1, 2], {"factor": 3})
    assert message.headers == {REF_HEADER: {"execution_id": "r", "activity_id": "1", "attempt": 2}}
    single = encode(Dispatch(Dispatch.ACTIVITY, "r", "q", "1", "shop.add", 1, True, call))
    assert (single.args, single.kwargs) == ([call], None)


# ── Harvest.start_task on SQLite: what it records, and that a refusal writes nothing ───────────
@pytest.fixture
def harvest(tmp_path):
    from harvest_celery import Harvest

    h = Harvest(f"sqlite:///{tmp_path / 'tasks.db'}")
    h.migrate()
    h.adopt_task("shop.add", queue="shop")
    h.adopt_task("shop.scale")
    yield h
    h.store.dispose()


def _counts(h):
    import sqlalchemy as sa

    with h.store.engine.connect() as conn:
        return {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar()
            for t in ("harvest_executions", "harvest_events", "harvest_activity_tasks", "harvest_outbox")
        }


def _started_input(h, execution_id):
    return h.store.get(execution_id).input


def test_the_built_in_workflow_is_reserved(harvest):
    from harvest_celery import DuplicateRegistration

    @workflow(name="harvest.start_task")
    async def mine(ctx, _):
        return None

    with pytest.raises(DuplicateRegistration):
        harvest.register(mine)


def test_start_task_records_the_call(harvest):
    run = harvest.start_task(scale.s(3).set(task_id="frozen", countdown=5), factor=4, execution_id="t-1")
    assert run == "t-1"
    payload = harvest.store.history("t-1")[0].event.input
    assert payload == {
        "task": "shop.scale",
        "call": {"args": [3], "kwargs": {"factor": 4}},
        "queue": None,
        "countdown": 5.0,
        "eta": None,
    }


def test_the_same_call_twice_is_one_run(harvest):
    first = harvest.start_task(add.s(1, 2), execution_id="same")
    frozen = add.s(1, 2)
    frozen.freeze()
    again = harvest.start_task(frozen, execution_id="same")
    assert first == again == "same"
    assert _counts(harvest)["harvest_executions"] == 1


def test_another_call_under_the_same_id_conflicts_on_input(harvest):
    from harvest_celery import ExecutionAlreadyExists

    harvest.start_task(add, 1, 2, execution_id="same")
    with pytest.raises(ExecutionAlreadyExists) as info:
        harvest.start_task(add, 1, 3, execution_id="same")
    assert info.value.conflict == "input"


BAD_CALLS = [
    (lambda h: h.start_task("shop.nope", 1), UnknownActivity, "must be adopted with harvest.adopt_task"),
    (lambda h: h.start_task(object()), UnknownActivity, "is not a Celery task"),
    (lambda h: h.start_task(add, {1}, 2), PayloadNotSerializable, "argument 0 of task 'shop.add'"),
    (lambda h: h.start_task(add, 1, **{"y": {2}}), PayloadNotSerializable, "keyword argument 'y'"),
    (lambda h: h.start_task(add.s(1, {2})), PayloadNotSerializable, "argument 1 of task 'shop.add'"),
    (
        lambda h: h.start_task(signature("shop.add", args=(1,), kwargs={2: 3})),
        PayloadNotSerializable,
        "keyword argument 2",
    ),
    (lambda h: h.start_task(add.si(1, 2), 3), InvalidTaskCall, "immutable signature"),
    (lambda h: h.start_task(add.s(1, 2).set(eta=datetime(2030, 1, 1))), InvalidTaskCall, "timezone-aware"),
    (lambda h: h.start_task(add.s(1, 2).set(countdown=1, eta=NOW)), InvalidTaskCall, "countdown and eta"),
    (lambda h: h.start_task(add.s(1, 2).set(countdown=-1)), InvalidTaskCall, "non-negative"),
    (lambda h: h.start_task(add.s(1, 2).set(shadow="x")), InvalidTaskCall, "'shadow' is not supported"),
    (lambda h: h.start_task(add.s(1, 2), execution_id="a:b"), Exception, "':'"),
] + [
    (lambda h, n=name: h.start_task(add.s(1, 2).set(**{n: 1})), InvalidTaskCall, f"{name!r} is refused")
    for name in sorted(REFUSED_OPTIONS)
]


@pytest.mark.parametrize(("call", "error", "text"), BAD_CALLS)
def test_a_refused_start_task_writes_nothing(harvest, call, error, text):
    before = _counts(harvest)
    with pytest.raises(error) as info:
        call(harvest)
    assert text in str(info.value)
    assert _counts(harvest) == before == dict.fromkeys(before, 0)


def test_an_invocation_over_the_cap_is_refused_and_writes_nothing(tmp_path):
    from harvest_celery import Harvest

    h = Harvest(f"sqlite:///{tmp_path / 'cap.db'}", max_activity_input_bytes=64)
    h.migrate()
    h.adopt_task("shop.add")
    with pytest.raises(PayloadTooLarge, match="input of activity 'shop.add'"):
        h.start_task(add, "x" * 100, 1)
    assert _counts(h) == dict.fromkeys(_counts(h), 0)
    h.store.dispose()


def test_start_task_refuses_on_a_schema_older_than_the_convention_and_writes_nothing(tmp_path):
    from harvest_celery import Harvest
    from harvest_celery._store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0007")
    h = Harvest(url)
    h.adopt_task("shop.add")
    with pytest.raises(InvalidTaskCall, match=r"older than the call convention \(migration 0008\)") as info:
        h.start_task(add, 1, 2)
    assert info.value.option == "schema"
    assert _counts(h) == dict.fromkeys(_counts(h), 0)
    upgrade(url)  # the migration first; then the same call starts its run
    assert h.start_task(add, 1, 2, execution_id="after") == "after"
    h.store.dispose()


def test_every_dispatch_site_carries_the_convention_into_the_message(harvest):
    """The first send, the sweeper's re-send of a lost message, and a retry's fresh message all
    carry the recorded call as the message's args and kwargs (and the claim reads it back)."""
    from harvest_celery._store import sweeps, tasks
    from harvest_celery._store.records import Timings, utcnow
    from harvest_celery._store.schema import activity_tasks

    sent = []
    inline = harvest.runtime.dispatcher
    send = inline.send
    inline.send = lambda m: (sent.append(m), send(m))  # embedded: the adopted task never runs
    rid = harvest.start_task(scale, 3, factor=4)
    first = [m for m in sent if m.task_name == "shop.scale"]
    assert [(m.args, m.kwargs) for m in first] == [([3], {"factor": 4})]
    (row,) = harvest.store.activity_rows(rid)
    assert row["call_convention"] == "args_kwargs"
    later = utcnow() + timedelta(hours=1)
    with harvest.store.begin() as tx:
        sweeps.stale_scheduled(tx, later, Timings())
    assert [(d.call_convention, d.input) for d in tx.dispatches] == [
        ("args_kwargs", {"args": [3], "kwargs": {"factor": 4}})
    ]
    with harvest.store.begin() as tx:
        claimed = tasks.claim(tx, rid, "1", 1, "w", later, Timings())
    assert claimed is not None and claimed.call_convention == "args_kwargs"
    with harvest.store.begin() as tx:
        tx.conn.execute(activity_tasks.update().values(status="retry_wait"))
        tasks.redispatch_next_attempt(tx, rid, "1", later)
    (retry,) = tx.dispatches
    assert encode(retry).args == [3] and encode(retry).kwargs == {"factor": 4} and retry.attempt == 2
