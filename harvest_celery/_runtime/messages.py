"""The Celery message protocol, in one place: what a ``Dispatch`` becomes on the wire.

* A decision request is the task ``harvest.decide`` with the execution id as its one argument,
  on the decision queue, task id ``decide:{execution_id}:{requested_at}``.
* An engine-native activity attempt is the task named after the activity with the ids as its
  arguments ``[execution_id, activity_id, attempt]`` (never the payload), task id
  ``{execution_id}:{activity_id}:{attempt}`` (so Flower shows which run a task belongs to).
* An adopted (existing) task keeps its signature: its input is its one argument, or, under
  ``CallConvention.ARGS_KWARGS``, the input ``{"args", "kwargs"}`` is the message's own args and
  kwargs (so ``self.request``, Celery's signals and Flower show the call as Celery would; the
  body still gets the recorded values). The ids travel in the ``harvest`` header.
* A deadline (start_to_close) travels in the ``harvest_time_limit`` header and as the message's
  Celery time limits.
* An activity attempt's priority (0..9, 9 first) becomes the message's ``priority`` only under
  ``Harvest(message_priority=True)``, mapped for the broker (``broker_priority``); a decision
  request never carries one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harvest_celery._core.limits import PRIORITY_MAX
from harvest_celery._core.names import CallConvention
from harvest_celery._store.records import Dispatch, RelayedMessage

DECIDE_TASK = "harvest.decide"
REF_HEADER = "harvest"
TIME_LIMIT_HEADER = "harvest_time_limit"


@dataclass(frozen=True)
class Message:
    task_name: str
    queue: str
    args: list[Any]
    task_id: str
    headers: dict[str, Any] | None = None
    kwargs: dict[str, Any] | None = None
    priority: int | None = None  # harvest's (0..9, 9 first): an activity attempt's, else None

    @property
    def time_limits(self) -> dict[str, float]:
        deadline = (self.headers or {}).get(TIME_LIMIT_HEADER)
        if not deadline:  # honoured by prefork pools; the lease sweep covers the others
            return {}
        return {"soft_time_limit": float(deadline), "time_limit": float(deadline) + 5}


# The broker's order of a message priority, by kombu transport (``driver_type``): RabbitMQ
# (classic queues with ``x-max-priority``, and quorum queues from RabbitMQ 4.0, which take 0-4 as
# normal and 5-9 as high) delivers higher first, as harvest orders; Celery's Redis transport
# delivers 0 first. Any other transport: no message priority.
HIGHER_FIRST = frozenset({"amqp"})
LOWER_FIRST = frozenset({"redis"})


def broker_priority(priority: int, driver_type: str) -> int | None:
    """Harvest's priority (0..9, 9 first) as the message priority ``driver_type``'s broker
    orders the same way: as is on RabbitMQ, ``9 - priority`` on Redis, None (none sent) on any
    other transport."""
    if driver_type in HIGHER_FIRST:
        return priority
    if driver_type in LOWER_FIRST:
        return PRIORITY_MAX - priority
    return None


def activity_task_id(execution_id: str, activity_id: str, attempt: int) -> str:
    return f"{execution_id}:{activity_id}:{attempt}"


def encode(dispatch: Dispatch) -> Message:
    if dispatch.kind == Dispatch.DECIDE:
        return Message(
            DECIDE_TASK,
            dispatch.queue,
            [dispatch.execution_id],
            f"decide:{dispatch.execution_id}:{dispatch.requested_at}",
        )
    task_id = activity_task_id(dispatch.execution_id, dispatch.activity_id, dispatch.attempt)
    headers: dict[str, Any] = {TIME_LIMIT_HEADER: dispatch.deadline} if dispatch.deadline else {}
    if dispatch.adopted:
        ref = {
            "execution_id": dispatch.execution_id,
            "activity_id": dispatch.activity_id,
            "attempt": dispatch.attempt,
        }
        headers = {REF_HEADER: ref, **headers}
        if dispatch.call_convention == CallConvention.ARGS_KWARGS.value:
            call = dispatch.input
            return Message(
                dispatch.activity_name,
                dispatch.queue,
                list(call["args"]),
                task_id,
                headers,
                dict(call["kwargs"]),
                dispatch.priority,
            )
        return Message(
            dispatch.activity_name,
            dispatch.queue,
            [dispatch.input],
            task_id,
            headers,
            priority=dispatch.priority,
        )
    return Message(
        dispatch.activity_name,
        dispatch.queue,
        [dispatch.execution_id, dispatch.activity_id, dispatch.attempt],
        task_id,
        headers or None,
        priority=dispatch.priority,
    )


def relayed(message: RelayedMessage) -> Message:
    return Message(message.task_name, message.queue, list(message.args), message.task_id, message.headers)


def activity_ref(args: Any, headers: Any) -> tuple[str, str, int] | None:
    """The ids of an activity attempt from a message's arguments or its ``harvest`` header."""
    ref = (headers or {}).get(REF_HEADER) if isinstance(headers, dict) else None
    if isinstance(ref, dict):
        return str(ref["execution_id"]), str(ref["activity_id"]), int(ref["attempt"])
    if args is not None and len(args) == 3:
        return str(args[0]), str(args[1]), int(args[2])
    return None
