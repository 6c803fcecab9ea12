"""A decision worker's own queue, ``<decision queue>@<node name>``: one declaration for its
consumer and for every sender.

Sticky routing (``celery.py``, ``_route_to_this_process``) gives each thread or solo decision
worker a queue of its own. On RabbitMQ a queue outlives its consumer unless told otherwise, so a
fleet with a fresh hostname per container would grow one queue per start without bound, each a
replicated quorum queue under quorum defaults. The sticky queue is therefore declared:

* classic (``x-queue-type: classic``), whatever ``task_default_queue_type`` or
  ``task_create_missing_queue_type`` say: a single worker's queue needs no replication;
* with ``x-expires`` (``Harvest(sticky_queue_expires=...)``): RabbitMQ deletes it once it has had
  no consumer for that long, messages and all. Correctness never rests on it: ``stale_decisions``
  (``_store/sweeps.py``) clears the run's ``sticky_queue`` and re-requests its decision on the
  decision queue after ``redispatch_after``;
* on the default exchange (the queue's name is its routing key), so no exchange of its own
  outlives it;
* non-durable — except on RabbitMQ 4.3 and later, which refuse non-durable, non-exclusive queues
  by default: there it is durable, with the same ``x-expires``.

A sender declares the queue it publishes to (Celery's ``declare=[queue]``), so a sender that
named the queue by string would declare it with the app's defaults: PRECONDITION_FAILED against
the worker's declaration, or a durable quorum queue when the sender came first. Both sides take
the queue from ``sticky_queue`` below.
"""

from __future__ import annotations

import re
from typing import Any

from kombu import Exchange, Queue

# RabbitMQ 4.3 refuses transient non-exclusive queues by default (deprecated feature
# transient_nonexcl_queues): from this version on the sticky queue is durable
DURABLE_FROM = (4, 3)
_CACHE_LIMIT = 256


def is_sticky(queue: str, decision_queue: str) -> bool:
    return queue.startswith(f"{decision_queue}@")


def sticky_queue(app: Any, name: str, expires: float) -> Queue:
    """The sticky queue ``name`` as both its consumer and its senders declare it (cached per app
    and process, so the broker's version is asked once)."""
    cache: dict[tuple[str, float], Queue] = app.__dict__.setdefault("_harvest_sticky_queues", {})
    key = (name, expires)
    found = cache.get(key)
    if found is not None:
        return found
    arguments: dict[str, Any] = {"x-queue-type": "classic", "x-expires": int(expires * 1000)}
    max_priority = app.conf.task_queue_max_priority
    if max_priority is not None:  # what Celery's Queues would add to the consumer's declaration
        arguments["x-max-priority"] = max_priority
    durable = durable_sticky_queues(app)
    queue = Queue(
        name,
        Exchange(""),  # the default exchange: none of its own to outlive the queue
        routing_key=name,
        durable=durable,
        auto_delete=False,
        queue_arguments=arguments,
    )
    if len(cache) >= _CACHE_LIMIT:  # names of workers long gone
        cache.clear()
    cache[key] = queue
    return queue


def durable_sticky_queues(app: Any) -> bool:
    """Must the sticky queue be durable: is the broker RabbitMQ 4.3 or later (asked once per
    app and process; any other broker: no)."""
    cached = app.__dict__.get("_harvest_sticky_durable")
    if cached is None:
        cached = server_version(app) >= DURABLE_FROM
        app.__dict__["_harvest_sticky_durable"] = cached
    return bool(cached)


def server_version(app: Any) -> tuple[int, ...]:
    """The RabbitMQ server's version from the AMQP handshake; ``()`` for any other broker."""
    with app.connection_for_write() as conn:
        if conn.transport.driver_type != "amqp":
            return ()
        conn.ensure_connection(max_retries=3)
        properties = getattr(conn.connection, "server_properties", None) or {}
    return parse_version(properties.get("version") or properties.get(b"version") or "")


def parse_version(text: Any) -> tuple[int, ...]:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return tuple(int(part) for part in re.findall(r"\d+", str(text))[:3])
