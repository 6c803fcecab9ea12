"""Activity limits as declared (docs/flow-control.md): the decorator's and ``adopt_task``'s
options are checked at decoration, ``execute_activity(priority=)`` before anything is recorded,
and a ``limit_key`` is called once per new command, its bad answers raising ``InvalidLimitKey``
into the workflow with nothing recorded. Pure: the in-memory ``Simulator``, no services."""

from __future__ import annotations

import pytest

from harvest_celery import Harvest, InvalidLimitKey, activity, workflow
from harvest_celery._core import events as ev
from harvest_celery._core.commands import ScheduleActivity
from harvest_celery._core.limits import check_concurrency, parse_rate_limit
from harvest_celery.testing import Simulator

KEY_CALLS: list[object] = []


def merchant(payload):
    KEY_CALLS.append(payload)
    return payload["merchant"]


@activity(name="charge", concurrency=2, limit_key=merchant)
def charge(payload):
    return payload["amount"]


@activity(name="plain")
def plain(x):
    return x


@activity(name="bad_key", concurrency=1, limit_key=lambda payload: payload)
def bad_key(payload):
    return payload


@workflow(name="pay")
async def pay(ctx, payload):
    return await ctx.execute_activity(charge, payload, priority=payload.get("priority", 0))


@workflow(name="keyed_badly")
async def keyed_badly(ctx, payload):
    try:
        await ctx.execute_activity(bad_key, payload)
    except InvalidLimitKey as exc:
        return exc.reason
    return "dispatched"


@workflow(name="keyed_badly_uncaught")
async def keyed_badly_uncaught(ctx, payload):
    return await ctx.execute_activity(bad_key, payload)


@workflow(name="prioritised")
async def prioritised(ctx, priority):
    try:
        await ctx.execute_activity(plain, 1, priority=priority)
    except ValueError as exc:
        return str(exc)
    return "dispatched"


def sim():
    return Simulator(pay, keyed_badly, keyed_badly_uncaught, prioritised, charge, plain, bad_key)


# ── decoration-time checks ───────────────────────────────────────────────────────────────────
def test_the_declared_limits_are_on_the_definition():
    limits = charge.__harvest_activity__.limits
    assert limits.concurrency == 2 and limits.limited and limits.rate_limit is None
    assert plain.__harvest_activity__.limits.limited is False


@pytest.mark.parametrize(
    ("text", "count", "period"), [("20/s", 20, 1.0), ("5/m", 5, 60.0), ("100/h", 100, 3600.0)]
)
def test_rate_limits_take_celerys_format(text, count, period):
    rate = parse_rate_limit(text)
    assert (rate.count, rate.period, rate.text) == (count, period, text)


def test_a_valid_rate_limit_is_declared_with_its_emission_interval():
    limits = activity(name="x", rate_limit="20/s")(lambda i: i).__harvest_activity__.limits
    assert limits.limited and limits.concurrency is None and limits.rate_limit.text == "20/s"
    assert limits.rate_limit.interval == 0.05  # burst one: starts spaced 1/rate apart
    assert parse_rate_limit("5/s").interval == 0.2
    assert parse_rate_limit("2/m").interval == 30.0


def test_a_rate_limit_may_be_keyed_and_combined_with_concurrency():
    limits = activity(name="x", concurrency=2, rate_limit="5/s", limit_key=lambda i: i["m"])(
        lambda i: i
    ).__harvest_activity__.limits
    assert (limits.concurrency, limits.rate_limit.text) == (2, "5/s") and limits.limit_key is not None
    assert activity(name="y", rate_limit="5/m", limit_key=str)(
        lambda i: i
    ).__harvest_activity__.limits.limited


@pytest.mark.parametrize("bad", ["ten per second", "0/s", "20/d", "-1/s", "20", " 20/s", "1.5/s", 20, ""])
def test_a_bad_rate_limit_is_refused_at_decoration(bad):
    with pytest.raises(ValueError, match="rate_limit must be a positive integer"):
        activity(name="x", rate_limit=bad)


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.5, "3"])
def test_a_bad_concurrency_is_refused_at_decoration(bad):
    with pytest.raises(ValueError, match="concurrency must be an int >= 1"):
        activity(name="x", concurrency=bad)


def test_an_override_may_hold_every_slot_with_zero_but_never_go_negative():
    assert check_concurrency(0, allow_zero=True) == 0
    with pytest.raises(ValueError, match="concurrency must be an int >= 0"):
        check_concurrency(-1, allow_zero=True)


def test_a_non_callable_limit_key_is_refused():
    with pytest.raises(TypeError, match="limit_key must be callable"):
        activity(name="x", concurrency=1, limit_key="merchant")


def test_a_limit_key_without_a_limit_is_refused():
    with pytest.raises(ValueError, match="limit_key without a limit"):
        activity(name="x", limit_key=lambda i: i)


def test_adopt_task_checks_the_same_options_and_registers_nothing_when_bad():
    harvest = Harvest("postgresql://unused/none", celery_app=None)
    with pytest.raises(ValueError, match="rate_limit"):
        harvest.adopt_task("legacy.send", rate_limit="20/d")
    with pytest.raises(ValueError, match="limit_key without a limit"):
        harvest.adopt_task("legacy.send", limit_key=str)
    assert "legacy.send" not in harvest.registry.activities
    harvest.adopt_task("legacy.send", concurrency=3, rate_limit="2/s")
    assert harvest.registry.activity("legacy.send").limits.concurrency == 3
    assert harvest.registry.activity("legacy.send").limits.rate_limit.text == "2/s"


# ── priority ─────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("bad", [10, -1, "9", True, 2.0])
def test_a_bad_priority_raises_into_the_workflow_and_records_nothing(bad):
    run = sim().start("prioritised", bad).run_to_end()
    assert "priority must be an int from 0 to 9" in run.events[-1].result
    assert not run.scheduled()


def test_the_priority_and_the_key_ride_on_the_command_not_on_the_event():
    run = sim().start("pay", {"merchant": "m-1", "amount": 5, "priority": 9})
    decision = run.decide()
    (command,) = [c for c in decision.commands if isinstance(c, ScheduleActivity)]
    assert (command.priority, command.limit_key) == (9, "m-1")
    (scheduled,) = run.scheduled()
    assert not hasattr(scheduled, "priority") and not hasattr(scheduled, "limit_key")


def test_priority_defaults_to_zero():
    run = sim().start("pay", {"merchant": "m-1", "amount": 5})
    (command,) = [c for c in run.decide().commands if isinstance(c, ScheduleActivity)]
    assert command.priority == 0


# ── limit keys ───────────────────────────────────────────────────────────────────────────────
def test_limit_key_is_called_only_for_a_new_command():
    KEY_CALLS.clear()
    run = sim().start("pay", {"merchant": "m-7", "amount": 3}).run_to_end()
    assert run.events[-1] == ev.WorkflowCompleted(3)
    assert KEY_CALLS == [{"merchant": "m-7", "amount": 3}]  # the replay that matched it never called it


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (7, "limit_key returned int, not str"),
        ("k" * 201, "limit_key returned 201 characters, over 200"),
    ],
)
def test_a_bad_key_raises_invalid_limit_key_before_anything_is_recorded(payload, reason):
    run = sim().start("keyed_badly", payload).run_to_end()
    assert run.events == [ev.WorkflowStarted("keyed_badly", payload), ev.WorkflowCompleted(reason)]


def test_a_key_function_that_raises_gives_invalid_limit_key():
    run = sim().start("pay", {"amount": 1}).run_to_end()  # no "merchant": KeyError in the key
    assert not run.scheduled()
    (failed,) = [e for e in run.events if isinstance(e, ev.WorkflowFailed)]
    assert failed.error_type == "InvalidLimitKey" and "limit_key raised KeyError" in failed.message


def test_a_200_character_key_is_accepted():
    run = sim().start("keyed_badly_uncaught", "k" * 200)
    (command,) = [c for c in run.decide().commands if isinstance(c, ScheduleActivity)]
    assert command.limit_key == "k" * 200
