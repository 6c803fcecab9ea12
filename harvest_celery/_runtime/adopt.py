"""Existing Celery tasks used as activities by name.

An adopted task keeps its signature. Called with ``ctx.execute_activity`` it receives the
activity input as its one positional argument; called with ``ctx.execute_task`` or
``Harvest.start_task`` (``CallConvention.ARGS_KWARGS``, recorded on its ``ActivityScheduled``)
the input is the call ``{"args", "kwargs"}`` and the body runs as ``body(*args, **kwargs)``; a
canvas run's dispatches add ``per_item`` (a chunk or starmap: the body once per item) and, for
compensations, ``envelope_output`` (the body gets the node's result) and ``envelope``. The
payload transits the broker, unlike engine-native activities, and the ids travel in the
``harvest`` message header. The same claim guards its body: the task's ``run`` is wrapped so
that it refuses to run unless the pre-run claim committed; the recorded input is spread only
after that, and the body always gets the recorded values, never the message's.
"""

from __future__ import annotations

import functools
import logging
from functools import partial
from typing import Any

from celery import Celery, signals
from celery.exceptions import Retry

from harvest_celery._core.names import CallConvention
from harvest_celery._core.registry import ActivityDefinition
from harvest_celery._errors import CanvasNotSupported
from harvest_celery._runtime import claim as claims
from harvest_celery._runtime import sentry
from harvest_celery._runtime.messages import REF_HEADER
from harvest_celery._runtime.outcomes import settle
from harvest_celery._runtime.runtime import Runtime

log = logging.getLogger("harvest_celery")


def _ref(task: Any) -> dict[str, Any] | None:
    request = task.request
    ref = getattr(request, REF_HEADER, None)
    if ref is None:
        headers = getattr(request, "headers", None) or {}
        ref = headers.get(REF_HEADER)
    return ref if isinstance(ref, dict) else None


def _call(body: Any, call_convention: str | None, value: Any) -> Any:
    """The body called with its recorded input, as the dispatch's recorded convention says."""
    if call_convention == CallConvention.ARGS_KWARGS.value:
        return body(*value["args"], **value["kwargs"])
    if call_convention == CallConvention.ENVELOPE_OUTPUT.value:
        return body(value["output"])  # an undo task written def release(reservation)
    if call_convention == CallConvention.PER_ITEM.value:
        # a chunk or starmap: every item, in order, in this one attempt (a retry runs them all)
        return [body(*item) for item in value["items"]]
    return body(value)  # one argument: an activity input, or the whole envelope (ENVELOPE)


def _as_engine_attempt(task: Any, body: Any, call_convention: str | None, value: Any) -> Any:
    """Run an adopted body as one engine attempt: ``self.retry()`` (and ``autoretry_for``) raise
    the retried exception here instead of publishing a Celery retry, and a ``Retry`` that still
    escapes is unwrapped to its cause, so the engine's retry policy sees the real error."""
    request = task.request
    directly = getattr(request, "called_directly", False)
    request.called_directly = True  # Task.retry re-raises instead of re-sending the message
    setattr(request, RUNNING, True)  # Task.replace and add_to_chord refuse (_refuse_dynamic)
    try:
        return _call(body, call_convention, value)
    except Retry as retry:
        if isinstance(retry.exc, BaseException):
            raise retry.exc from None
        raise
    finally:
        request.called_directly = directly
        setattr(request, RUNNING, False)


RUNNING = "harvest_attempt"  # set on the task's request while harvest runs its body


def _refuse_dynamic(task: Any) -> None:
    """``Task.replace()`` and ``add_to_chord`` in a body harvest runs would send Celery work
    harvest never records (a canvas grown at run time): the attempt fails with
    ``CanvasNotSupported``, which is never retried. Outside harvest they work as before."""
    for method in ("replace", "add_to_chord"):
        setattr(task, method, _refusing(task, method, getattr(task, method)))


def _refusing(task: Any, method: str, original: Any) -> Any:
    @functools.wraps(original)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        if getattr(task.request, RUNNING, False):
            raise CanvasNotSupported(
                method,
                f"Task.{method}() in task {task.name!r} is not supported when harvest runs it: "
                "a canvas is compiled once, at start (docs/canvas.md)",
            )
        return original(*args, **kwargs)

    return refusing


def adopt(app: Celery, runtime: Runtime, definition: ActivityDefinition) -> None:
    """Guard an existing task (registered on ``app`` now or later) with the claim."""

    def guard(task: Any) -> None:
        if getattr(task, "_harvest_adopted", False):
            return
        original = task.run
        # Celery's autoretry_for wraps run; the engine retries by its own policy instead, so the
        # body is the unwrapped run, and an explicit self.retry() raises its exception
        body = getattr(task, "_orig_run", original)

        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            ref = _ref(task)
            if ref is None:
                return original(*args, **kwargs)  # an ordinary call, not dispatched by harvest
            claimed = claims.claim(
                runtime, str(ref["execution_id"]), str(ref["activity_id"]), int(ref["attempt"])
            )
            convention = claimed.call_convention if claimed is not None else None
            ran, error = claims.run_claimed(
                runtime, claimed, partial(_as_engine_attempt, task, body, convention)
            )
            if error is not None:
                sentry.tag_attempt(str(ref["execution_id"]), task.name, int(ref["attempt"]))
            settle(runtime, ran, error, task.request.id)
            return None

        task.run = guarded
        _refuse_dynamic(task)
        task._harvest_adopted = True

    if definition.name in app.tasks:
        guard(app.tasks[definition.name])

    def on_worker_init(**_kw: Any) -> None:
        if definition.name in app.tasks:
            guard(app.tasks[definition.name])
        else:
            log.error("adopted activity %r is not a task registered on this Celery app", definition.name)

    signals.worker_init.connect(on_worker_init, weak=False)
