"""A durable call of an adopted Celery task, as data: the invocation ``{"args": [...],
"kwargs": {...}}`` recorded as the node's input under ``CallConvention.ARGS_KWARGS``, built from
plain arguments or from a Celery signature (read by duck typing: this package imports no
Celery), and the call options harvest honours, drops or refuses.

Arguments go through JSON as with Celery's json serializer (tuples come back as lists, kwargs
keys must be strings). The final args are computed here, before anything is recorded, so
history, replay and re-sends all see the same call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._errors import InvalidTaskCall, PayloadNotSerializable, UnknownActivity

NO_RESULT: Any = object()  # no previous result to prepend

# options Celery generates or harvest covers: dropped before the input is canonicalised
DROPPED_OPTIONS = frozenset(
    {"task_id", "group_id", "group_index", "root_id", "parent_id", "reply_to", "retry", "retry_policy"}
)
# accepted and changing nothing: harvest records the result itself
IGNORED_OPTIONS = frozenset({"ignore_result"})
HONOURED_OPTIONS = frozenset({"queue", "countdown", "eta"})
# refused by name, with the reason
REFUSED_OPTIONS: Mapping[str, str] = {
    "exchange": "it goes beyond a queue; name a queue instead",
    "routing_key": "it goes beyond a queue; name a queue instead",
    "link": "callbacks belong to durable canvases",
    "link_error": "callbacks belong to durable canvases",
    "expires": "honouring it needs a schedule-to-start deadline, which harvest does not have yet",
    "priority": "harvest dispatches by queue only",
    "time_limit": "use adopt_task(start_to_close=...)",
    "soft_time_limit": "use adopt_task(start_to_close=...)",
    "serializer": "harvest records the call as JSON",
    "compression": "harvest records the call as JSON",
    "headers": "the harvest header carries the run's ids",
}


def task_name(task: Any) -> str:
    """The name of a Celery task object (its ``.name``) or a task name; ``UnknownActivity`` for
    anything else, ``InvalidTaskCall`` for a signature (``ctx.execute_task`` takes the task)."""
    if isinstance(task, str):
        return task
    if is_signature(task):
        raise InvalidTaskCall(
            "signature",
            f"ctx.execute_task takes a task or its name, not a signature ({task!r}): "
            "pass the task and its arguments, execute_task(task, *args, **kwargs)",
        )
    name = getattr(task, "name", None)
    if isinstance(name, str) and callable(getattr(task, "apply_async", None)):
        return name
    raise UnknownActivity(
        repr(task), f"{task!r} is not a Celery task: pass a task adopted with harvest.adopt_task, or its name"
    )


def adopted_task_name(registry: Registry, task: Any) -> str:
    """``task_name(task)``, which must name a task adopted with ``adopt_task``."""
    name = task_name(task)
    definition = registry.activities.get(name)
    if definition is None or not definition.adopted:
        raise UnknownActivity(
            name, f"unknown task {name!r}: a task called durably must be adopted with harvest.adopt_task"
        )
    return name


def schema_too_old() -> InvalidTaskCall:
    return InvalidTaskCall(
        "schema",
        "the database schema is older than the call convention (migration 0008): a durable task "
        "call needs the migration and every worker upgraded first (docs/operations.md, "
        '"Upgrading harvest-celery")',
    )


@dataclass(frozen=True)
class CallOptions:
    """The options of a call that harvest honours: the queue (None: the adopted definition's),
    and when the task may run: ``countdown`` seconds after the run starts, or at ``eta``
    (neither: at once)."""

    queue: str | None = None
    countdown: float | None = None
    eta: datetime | None = None


def invocation(task_name: str, args: Sequence[Any], kwargs: Mapping[Any, Any]) -> dict[str, Any]:
    """``{"args": [...], "kwargs": {...}}`` as it will read back from history, or
    ``PayloadNotSerializable`` naming the position or the key."""
    checked_args = [check_json(a, f"argument {i} of task {task_name!r}") for i, a in enumerate(args)]
    checked_kwargs: dict[str, Any] = {}
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise PayloadNotSerializable(
                f"keyword argument {key!r} of task {task_name!r}", "a kwargs key must be a string"
            )
        checked_kwargs[key] = check_json(value, f"keyword argument {key!r} of task {task_name!r}")
    return {"args": checked_args, "kwargs": checked_kwargs}


def is_signature(value: Any) -> bool:
    """A Celery signature (``task.s(...)``, ``task.si(...)``), told by its shape."""
    return (
        isinstance(value, dict) and "task" in value and hasattr(value, "immutable") and hasattr(value, "args")
    )


def signature_call(
    sig: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[Any, Any] | None = None,
    previous: Any = NO_RESULT,
) -> tuple[str, list[Any], dict[Any, Any], dict[str, Any]]:
    """The task name, final args, final kwargs and options of calling ``sig`` as Celery would:
    for a partial signature ``previous`` (a chain's previous result) and then ``args`` are
    prepended to ``sig.args``; an immutable one keeps its args, and is refused more arguments
    (Celery would drop them silently). Call-time kwargs are merged over ``sig.kwargs``."""
    extra = ([] if previous is NO_RESULT else [previous]) + list(args)
    kwargs = dict(kwargs or {})
    if sig.immutable:
        if extra or kwargs:
            raise InvalidTaskCall(
                "immutable",
                f"the immutable signature of task {sig.task!r} (.si) was given more arguments: "
                "use .s for a partial signature, or put every argument in the signature",
            )
        return str(sig.task), list(sig.args), dict(sig.kwargs), dict(sig.options)
    return str(sig.task), extra + list(sig.args), {**sig.kwargs, **kwargs}, dict(sig.options)


def call_options(options: Mapping[str, Any]) -> CallOptions:
    """Sort ``options``: honoured (``queue``, ``countdown``, ``eta``), dropped, ignored, or
    ``InvalidTaskCall`` for a refused or unknown one, a naive ``eta``, ``countdown`` with
    ``eta``, or a negative ``countdown``."""
    for name in options:
        if name in REFUSED_OPTIONS:
            raise InvalidTaskCall(name, f"call option {name!r} is refused: {REFUSED_OPTIONS[name]}")
        if name not in HONOURED_OPTIONS | DROPPED_OPTIONS | IGNORED_OPTIONS:
            raise InvalidTaskCall(name, f"call option {name!r} is not supported by a durable task call")
    countdown, eta = options.get("countdown"), options.get("eta")
    if countdown is not None and eta is not None:
        raise InvalidTaskCall("countdown", "countdown and eta cannot be given together")
    if countdown is not None and (
        isinstance(countdown, bool) or not isinstance(countdown, (int, float)) or countdown < 0
    ):
        raise InvalidTaskCall("countdown", f"countdown must be a non-negative number, not {countdown!r}")
    if eta is not None and (not isinstance(eta, datetime) or eta.tzinfo is None or eta.utcoffset() is None):
        raise InvalidTaskCall("eta", f"eta must be a timezone-aware datetime, not {eta!r}")
    queue = options.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise InvalidTaskCall("queue", f"queue must be a non-empty string, not {queue!r}")
    return CallOptions(queue, None if countdown is None else float(countdown), eta)


# ── the built-in workflow Harvest.start_task runs ────────────────────────────────────────────
START_TASK = "harvest.start_task"  # reserved: registered in every Harvest registry


def start_task_input(
    name: str, call: dict[str, Any], queue: str | None, options: CallOptions
) -> dict[str, Any]:
    """The built-in run's input: the task, its call, its queue, and when it may run (a
    countdown counts from the run's start, so the same call twice is the same input)."""
    return {
        "task": name,
        "call": call,
        "queue": queue,
        "countdown": options.countdown,
        "eta": None if options.eta is None else options.eta.isoformat(),
    }


async def start_task_workflow(ctx: Any, input: dict[str, Any]) -> Any:
    """Wait on a durable timer if one is due (deterministic: the not-before instant minus
    ``ctx.now()``, both recorded), then call the task once with its recorded call."""
    if input.get("countdown") is not None:
        not_before = ctx.info.started_at + timedelta(seconds=input["countdown"])
    elif input.get("eta") is not None:
        not_before = datetime.fromisoformat(input["eta"])
    else:
        not_before = None
    if not_before is not None:
        wait = (not_before - ctx.now()).total_seconds()
        if wait > 0:
            await ctx.sleep(wait)
    call = input["call"]
    return await ctx.execute_task(input["task"], *call["args"], queue=input.get("queue"), **call["kwargs"])


def register_start_task(registry: Registry) -> None:
    registry.add_workflow(WorkflowDefinition(START_TASK, start_task_workflow))
