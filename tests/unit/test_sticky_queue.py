"""A sticky queue is declared one way by its consumer and by every sender: classic, x-expires
from the setting, non-durable (durable from RabbitMQ 4.3), whatever the app's queue-type
defaults. Celery's real routing and queue tables, on the memory transport (no broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from harvest_celery._runtime.celery import CeleryDispatcher, _route_to_this_process
from harvest_celery._runtime.messages import DECIDE_TASK, Message
from harvest_celery._runtime.settings import Settings
from harvest_celery._runtime.sticky import DURABLE_FROM, parse_version, sticky_queue

NAME = "harvest@w1-abc@host"


class RecordingApp(Celery):  # a real Celery app whose broker call is recorded, not made
    def __init__(self, **conf: Any) -> None:
        super().__init__("record", broker="memory://")
        self.conf.update(conf)
        self.sent: list[dict[str, Any]] = []

    def send_task(self, name: str, **kwargs: Any) -> None:
        self.sent.append({"name": name, **kwargs})


QUORUM = {"task_default_queue_type": "quorum", "task_create_missing_queue_type": "quorum"}


def _worker_side(app: Celery, expires: float = 300.0) -> Any:
    runtime = SimpleNamespace(settings=Settings(sticky_queue_expires=expires), sticky_queue=None)
    worker = SimpleNamespace(
        pool_cls=SimpleNamespace(__module__="celery.concurrency.thread"), hostname="w1-abc@host"
    )
    app.amqp.queues.select("harvest")
    _route_to_this_process(app, runtime, worker)  # type: ignore[arg-type]
    assert runtime.sticky_queue == NAME
    return app.amqp.queues.consume_from[NAME]


def test_under_quorum_defaults_the_consumer_declares_a_classic_transient_expiring_queue() -> None:
    app = RecordingApp(**QUORUM)
    queue = _worker_side(app, expires=12.5)
    assert queue.queue_arguments == {"x-queue-type": "classic", "x-expires": 12500}
    assert queue.durable is False and queue.auto_delete is False
    # the app's own queues keep its defaults
    assert app.amqp.queues["harvest"].queue_arguments == {"x-queue-type": "quorum"}


def test_a_sender_declares_the_sticky_queue_exactly_as_its_consumer() -> None:
    consumer = _worker_side(RecordingApp(**QUORUM), expires=12.5)
    sender_app = RecordingApp(**QUORUM)  # another process: its queue table has never seen it
    CeleryDispatcher(sender_app, Settings(sticky_queue_expires=12.5)).send(
        Message(DECIDE_TASK, NAME, ["run-1"], "decide:run-1:1")
    )
    sent = sender_app.sent[0]["queue"]
    assert (sent.name, sent.durable, sent.auto_delete, sent.queue_arguments) == (
        consumer.name,
        consumer.durable,
        consumer.auto_delete,
        consumer.queue_arguments,
    )
    assert sent.routing_key == NAME


def test_a_queue_that_is_not_sticky_is_sent_by_name() -> None:
    app = RecordingApp(**QUORUM)
    dispatcher = CeleryDispatcher(app, Settings())
    dispatcher.send(Message(DECIDE_TASK, "harvest", ["run-1"], "decide:run-1:1"))
    dispatcher.send(Message("charge", "pay@ments", ["r", "1", 1], "r:1:1"))
    assert [m["queue"] for m in app.sent] == ["harvest", "pay@ments"]


def test_from_rabbitmq_4_3_the_sticky_queue_is_durable_with_the_same_expiry() -> None:
    app = RecordingApp()
    app.__dict__["_harvest_sticky_durable"] = True  # as asked of a 4.3 server
    queue = sticky_queue(app, NAME, 60)
    assert queue.durable is True and queue.auto_delete is False
    assert queue.queue_arguments == {"x-queue-type": "classic", "x-expires": 60000}
    assert parse_version("4.3.0") >= DURABLE_FROM > parse_version(b"4.2.9") > parse_version("3.10.8")


def test_a_priority_app_declares_the_same_max_priority_on_both_sides() -> None:
    consumer = _worker_side(RecordingApp(task_queue_max_priority=5))
    sender = sticky_queue(RecordingApp(task_queue_max_priority=5), NAME, 300.0)
    assert consumer.queue_arguments == sender.queue_arguments
    assert sender.queue_arguments["x-max-priority"] == 5


def test_prefork_keeps_no_sticky_queue() -> None:
    app = RecordingApp()
    runtime = SimpleNamespace(settings=Settings(), sticky_queue=None)
    worker = SimpleNamespace(
        pool_cls=SimpleNamespace(__module__="celery.concurrency.prefork"), hostname="p@h"
    )
    _route_to_this_process(app, runtime, worker)  # type: ignore[arg-type]
    assert runtime.sticky_queue is None


@pytest.mark.parametrize("bad", [0, -1, "5", True])
def test_a_bad_expiry_is_refused_before_anything_connects(bad: Any) -> None:
    from harvest_celery import Harvest

    with pytest.raises(ValueError, match="sticky_queue_expires accepts seconds above 0"):
        Harvest("postgresql+psycopg2://nobody@127.0.0.1:1/nowhere", sticky_queue_expires=bad)
