"""``HARVEST_MESSAGE_PRIORITY`` on real workers: with it on, an activity's message carries its
priority mapped for the broker (Redis: ``9 - p``; RabbitMQ, classic or quorum: as is), as the
worker receives it; off, harvest passes none and every message has kombu's default, 0, whatever
the activity's priority (found on the RabbitMQ leg: py-amqp sends 0 too, not an unset
property). docs/flow-control.md, "Message priority"."""

from __future__ import annotations

import json
from typing import Any

from .brokers import is_amqp
from .conftest import BROKER_URL, wait_for, worker_env, workers_decide

PRIORITIES = (0, 2, 9)


def _received(harvest: Any, redis_client: Any, tag: str) -> dict[int, Any]:
    with workers_decide(harvest):  # message_priority is the workers' setting here
        runs = {
            p: harvest.start_workflow("priority_call", {"tag": tag, "label": p, "priority": p})
            for p in PRIORITIES
        }
    for run in runs.values():
        harvest.result(run, timeout=60)
    found = wait_for(
        lambda: (
            (rows := redis_client.lrange(f"priorities:{tag}", 0, -1))
            and len(rows) == len(PRIORITIES)
            and rows
        ),
        what="every probe ran",
    )
    return {json.loads(x)["label"]: json.loads(x)["priority"] for x in found}


def test_on_each_message_carries_the_mapped_priority(harvest, workers, redis_client, tag):
    with worker_env(workers, HARVEST_MESSAGE_PRIORITY="1"):
        received = _received(harvest, redis_client, tag)
    expected = {p: p for p in PRIORITIES} if is_amqp(BROKER_URL) else {p: 9 - p for p in PRIORITIES}
    assert received == expected


def test_off_harvest_sends_no_priority(harvest, workers, redis_client, tag):
    received = _received(harvest, redis_client, tag)
    assert received == dict.fromkeys(PRIORITIES, 0)  # kombu's default, on Redis and on RabbitMQ
