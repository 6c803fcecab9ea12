"""What Celery's tracer does around a task body, reproduced for an eager attempt — in one place.

An eager attempt (``eager.py``) runs in a worker thread that is already inside another task (a
decision, or the activity that completed before it), so Celery's tracer never sees it. Code
written for Celery reads what that tracer sets up: ``current_task`` and its request, and the
``task_prerun`` / ``task_postrun`` / ``task_failure`` signals (Flower's hooks, the OpenTelemetry
instrumentation, error trackers). ``EagerAttempt`` gives them the same as a delivered message,
in the tracer's order (``celery/app/trace.py``, ``build_tracer``):

1. push the task on Celery's task stack and its own request (id, args, queue) on the task;
2. the claim (harvest's, taken by the caller) — then ``task_prerun``, before the body;
3. the body; then ``task_failure`` (a failed attempt) and ``task_postrun``, still as the
   current task;
4. pop both.

The request's ``delivery_info`` carries ``harvest_eager``: harvest's own ``task_prerun`` hook
(``celery._on_prerun``) skips such a request, so sending the signal never takes a second claim.

The one private name of Celery used here is ``celery._state._task_stack``, the stack
``current_task`` reads: Celery has no public way to push onto it. The version pin in
pyproject.toml names the Celery minors this was tested on (tests/integration/test_observability.py).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import signals
from celery._state import _task_stack

from harvest_celery._runtime.outcomes import for_celery
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store.records import Dispatch

EAGER_MARK = "harvest_eager"  # in an eager request's delivery_info


def is_eager(request: Any) -> bool:
    """Is this Celery request an eager attempt's (``EagerAttempt``)?"""
    delivery = getattr(request, "delivery_info", None) or {}
    return bool(delivery.get(EAGER_MARK))


class EagerAttempt:
    """One eager attempt as Celery's tracer would frame it (a context manager). With no Celery
    task of the activity's name in the app, it does nothing: there is nothing for Celery code to
    see."""

    def __init__(self, app: Any, d: Dispatch, task_id: str, args: list[Any], hostname: str | None) -> None:
        self.task = app.tasks.get(d.activity_name)
        self.dispatch = d
        self.task_id = task_id
        self.args = args
        self.hostname = hostname
        # a delivered message's reply_to is its sender's oid (``apply_async``): here, this thread's
        self.reply_to = app.thread_oid if self.task is not None else None

    def __enter__(self) -> EagerAttempt:
        task, d = self.task, self.dispatch
        if task is None:
            return self
        _task_stack.push(task)
        task.push_request(
            id=self.task_id,
            args=self.args,
            kwargs={},
            hostname=self.hostname,
            root_id=self.task_id,
            correlation_id=self.task_id,  # as a delivered message's (Celery sets it to the id)
            reply_to=self.reply_to,
            retries=d.attempt - 1,
            is_eager=False,
            called_directly=False,
            delivery_info={
                "routing_key": d.queue,
                "exchange": "",
                "priority": 0,
                "redelivered": False,
                EAGER_MARK: True,
            },
        )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.task is None:
            return
        self.task.pop_request()
        _task_stack.pop()

    def prerun(self) -> None:
        """``task_prerun``, after the claim and before the body (harvest's hook skips it)."""
        if self.task is None:
            return
        signals.task_prerun.send(
            sender=self.task, task_id=self.task_id, task=self.task, args=self.args, kwargs={}
        )

    def outcome(self, runtime: Runtime, ran: bool, error: BaseException | None) -> BaseException | None:
        """What the tracer signals at the end: ``task_failure`` for a failed attempt, then
        ``task_postrun`` (``IGNORED`` when the claim was refused). Returns the exception Celery
        code was shown (redacted under ``celery_error_detail="type"``), or None."""
        task = self.task
        if task is None:
            return None
        state = "IGNORED" if not ran else ("FAILURE" if error is not None else "SUCCESS")
        shown = for_celery(runtime, error, self.task_id) if error is not None else None
        if shown is not None:
            trace = shown.__traceback__
            signals.task_failure.send(
                sender=task,
                task_id=self.task_id,
                exception=shown,
                args=self.args,
                kwargs={},
                traceback=trace,
                einfo=ExceptionInfo((type(shown), shown, trace)),
            )
        signals.task_postrun.send(
            sender=task, task_id=self.task_id, task=task, args=self.args, kwargs={}, retval=shown, state=state
        )
        return shown


__all__ = ["EAGER_MARK", "EagerAttempt", "is_eager"]
