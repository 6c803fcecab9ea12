"""``Harvest(message_priority=True)``: an activity attempt's priority (0..9, 9 first) becomes its
message's ``priority``, mapped so the broker orders it as harvest does — as is on RabbitMQ
(higher first), ``9 - p`` on Celery's Redis transport (0 first), none on any other transport.
Off (the default) no message carries one, and the app's configuration is never changed.
docs/flow-control.md, "Message priority"."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from harvest_celery._runtime.celery import CeleryDispatcher
from harvest_celery._runtime.messages import DECIDE_TASK, Message, broker_priority, encode
from harvest_celery._runtime.settings import Settings, checked
from harvest_celery._store.records import Dispatch


class RecordingApp(Celery):  # a real Celery app whose broker call is recorded, not made
    def __init__(self, broker: str) -> None:
        super().__init__("record", broker=broker)
        self.sent: list[dict[str, Any]] = []

    def send_task(self, name: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.sent.append({"name": name, **kwargs})


def _attempt(priority: int) -> Message:
    return encode(Dispatch(Dispatch.ACTIVITY, "r", "payments", "1", "charge", 1, priority=priority))


@pytest.mark.parametrize("priority", range(10))
def test_rabbitmq_takes_the_priority_as_is_and_redis_inverted(priority: int) -> None:
    assert broker_priority(priority, "amqp") == priority
    assert broker_priority(priority, "redis") == 9 - priority


@pytest.mark.parametrize("driver", ["memory", "sqs", "filesystem", ""])
def test_any_other_transport_gets_no_message_priority(driver: str) -> None:
    assert broker_priority(9, driver) is None


@pytest.mark.parametrize(
    ("broker", "sent"),
    [
        ("amqp://guest@localhost//", [0, 2, 9]),
        ("redis://localhost:6379/0", [9, 7, 0]),
        ("memory://", [None] * 3),
    ],
)
def test_on_each_attempt_message_carries_its_mapped_priority(broker: str, sent: list[int | None]) -> None:
    app = RecordingApp(broker)
    dispatcher = CeleryDispatcher(app, Settings(message_priority=True))
    for priority in (0, 2, 9):
        dispatcher.send(_attempt(priority))
    assert [m.get("priority") for m in app.sent] == sent
    assert all(("priority" in m) == (p is not None) for m, p in zip(app.sent, sent, strict=True))


@pytest.mark.parametrize("broker", ["amqp://guest@localhost//", "redis://localhost:6379/0"])
def test_off_no_message_carries_a_priority(broker: str) -> None:
    app = RecordingApp(broker)
    dispatcher = CeleryDispatcher(app, Settings())
    for priority in (0, 9):
        dispatcher.send(_attempt(priority))
    assert len(app.sent) == 2 and all("priority" not in m for m in app.sent)


def test_a_decision_request_never_carries_a_priority() -> None:
    app = RecordingApp("amqp://guest@localhost//")
    decide = encode(Dispatch(Dispatch.DECIDE, "r", "harvest", requested_at=1.0))
    assert decide.task_name == DECIDE_TASK and decide.priority is None
    CeleryDispatcher(app, Settings(message_priority=True)).send(decide)
    assert "priority" not in app.sent[0]


def test_an_adopted_tasks_message_carries_its_priority_too() -> None:
    dispatch = Dispatch(
        Dispatch.ACTIVITY, "r", "q", "1", "legacy.send", 1, adopted=True, input={"a": 1}, priority=6
    )
    message = encode(dispatch)
    assert message.args == [{"a": 1}] and message.priority == 6


def test_the_apps_configuration_and_queues_are_never_changed() -> None:
    app = RecordingApp("amqp://guest@localhost//")
    app.conf.task_queue_max_priority = None
    before = {k: app.conf[k] for k in ("task_queues", "task_queue_max_priority", "task_default_priority")}
    CeleryDispatcher(app, Settings(message_priority=True)).send(_attempt(9))
    after = {k: app.conf[k] for k in before}
    assert app.sent[0]["priority"] == 9 and after == before


def test_the_setting_is_off_by_default_and_read_from_the_environment() -> None:
    assert checked({}, environ={})["message_priority"] is False
    assert checked({}, environ={"HARVEST_MESSAGE_PRIORITY": "1"})["message_priority"] is True
    assert (
        checked({"message_priority": False}, environ={"HARVEST_MESSAGE_PRIORITY": "1"})["message_priority"]
        is False
    )


@pytest.mark.parametrize("bad", ["yes", 1, "redis"])
def test_a_bad_value_is_refused_naming_the_setting(bad: Any) -> None:
    with pytest.raises(ValueError, match="message_priority accepts True or False"):
        checked({"message_priority": bad}, environ={})


def test_harvest_takes_the_keyword_and_the_dispatcher_sees_it(tmp_path: Any) -> None:
    from harvest_celery import Harvest

    app = RecordingApp("redis://localhost:6379/0")
    h = Harvest(f"sqlite:///{tmp_path / 'p.db'}", app, message_priority=True)
    assert h.runtime.settings.message_priority is True
    h.runtime.dispatcher.send(_attempt(8))
    assert app.sent[-1]["priority"] == 1


def test_a_first_message_and_a_release_from_waiting_keep_the_rows_priority(tmp_path: Any) -> None:
    """The first message and a release from ``waiting`` carry the task row's
    priority (embedded, so the messages are the inline dispatcher's)."""
    from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
    from harvest_celery._runtime.inline import InlineDispatcher

    @activity(name="mp_plain", retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
    def mp_plain(x: Any) -> Any:
        return x

    @activity(name="mp_limited", concurrency=1)
    def mp_limited(x: Any) -> Any:
        return x

    @workflow(name="mp_flow")
    async def mp_flow(ctx: WorkflowContext, data: dict[str, Any]) -> Any:
        return await ctx.execute_activity(data["activity"], data, priority=data["priority"])

    h = Harvest(f"sqlite:///{tmp_path / 'm.db'}").register(mp_plain, mp_limited, mp_flow)
    h.migrate()
    h._inline = None
    h.runtime.dispatcher = inline = InlineDispatcher()

    def sent(name: str) -> list[Message]:
        return [m for m in inline.queue if m.task_name == name]

    first = h.start_workflow("mp_flow", {"activity": "mp_plain", "priority": 7})
    h.runtime.run_decision(first)
    assert [m.priority for m in sent("mp_plain")] == [7]

    held = h.start_workflow("mp_flow", {"activity": "mp_limited", "priority": 1})
    h.runtime.run_decision(held)
    waiting = h.start_workflow("mp_flow", {"activity": "mp_limited", "priority": 8})
    h.runtime.run_decision(waiting)
    assert [m.args[0] for m in sent("mp_limited")] == [held]  # the second waits for the slot
    from harvest_celery._runtime import claim as claims

    claim = claims.claim(h.runtime, held, "1", 1)
    assert claim is not None
    claims.run_claimed(h.runtime, claim, lambda x: x)  # frees the slot: the waiting row is released
    released = [m for m in sent("mp_limited") if m.args[0] == waiting]
    assert [m.priority for m in released] == [8]
