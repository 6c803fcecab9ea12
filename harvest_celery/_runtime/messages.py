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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    @property
    def time_limits(self) -> dict[str, float]:
        deadline = (self.headers or {}).get(TIME_LIMIT_HEADER)
        if not deadline:  # honoured by prefork pools; the lease sweep covers the others
            return {}
        return {"soft_time_limit": float(deadline), "time_limit": float(deadline) + 5}


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
            )
        return Message(dispatch.activity_name, dispatch.queue, [dispatch.input], task_id, headers)
    return Message(
        dispatch.activity_name,
        dispatch.queue,
        [dispatch.execution_id, dispatch.activity_id, dispatch.attempt],
        task_id,
        headers or None,
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
