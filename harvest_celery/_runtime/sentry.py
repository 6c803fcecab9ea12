"""Sentry, when the application has imported and initialised ``sentry_sdk`` itself
(docs/observability.md, "Sentry"): harvest looks it up in ``sys.modules`` and never imports it,
so an application without Sentry loads nothing.

- A failed attempt carries ``harvest.execution_id``, ``harvest.activity`` and
  ``harvest.attempt`` as tags: on the broker path they are set on the task's scope, and Sentry's
  Celery integration reports the failure Celery is shown; an eager attempt raises out of no task,
  so it is captured here, explicitly, in a scope of its own.
- A workflow failure is reported once, after the commit that records it (``Tx.reports``), with
  the file and line the workflow code raised at; a replay, a probe or a query never reports.

What leaves harvest follows ``celery_error_detail``: under ``"type"`` only the exception type,
here as in Celery's view (``outcomes.for_celery`` decides what an attempt's event holds).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

_FILTERED = "[Filtered]"  # what Sentry's integration shows for a task's arguments (no PII)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


def sdk() -> Any | None:
    """``sentry_sdk``, if the application imported and initialised it (a client that sends);
    else None."""
    module = sys.modules.get("sentry_sdk")
    if module is None:
        return None
    try:
        client = module.get_client()  # initialised without a DSN: active, but sends nowhere
        return module if client.is_active() and getattr(client, "transport", None) is not None else None
    except Exception:  # noqa: BLE001 - an SDK we cannot ask is one we do not use
        return None


def attempt_tags(execution_id: str, activity: str, attempt: int) -> dict[str, str]:
    return {
        "harvest.execution_id": execution_id,
        "harvest.activity": activity,
        "harvest.attempt": str(attempt),
    }


def tag_attempt(execution_id: str, activity: str, attempt: int) -> None:
    """Broker path: the failed attempt's tags on the task's scope (the Celery integration gives
    each task an isolation scope of its own and reports from it)."""
    sentry = sdk()
    if sentry is not None:
        scope = sentry.get_isolation_scope()
        for key, value in attempt_tags(execution_id, activity, attempt).items():
            scope.set_tag(key, value)


def capture_attempt(
    execution_id: str, activity: str, attempt: int, shown: BaseException, task_id: str
) -> None:
    """Eager path: report the exception Celery code was shown, with the attempt's tags and what
    Sentry's Celery integration adds to a delivered task's event (the ``celery_task_id`` tag, the
    ``celery-job`` extra without its arguments), so both paths give the same event. Set by an
    event processor of this scope's, which runs after the integration's processor of the
    delivered task the attempt borrows a thread from (that one would name the outer task)."""
    sentry = sdk()
    if sentry is None:
        return
    tags = {**attempt_tags(execution_id, activity, attempt), "celery_task_id": task_id}
    job = {"task_name": activity, "args": _FILTERED, "kwargs": _FILTERED}

    def as_its_own_task(event: dict[str, Any], _hint: Any) -> dict[str, Any]:
        event.setdefault("tags", {}).update(tags)
        event.setdefault("extra", {})["celery-job"] = job
        return event

    with sentry.new_scope() as scope:
        for key, value in tags.items():
            scope.set_tag(key, value)
        scope.add_event_processor(as_its_own_task)
        sentry.capture_exception(shown)


@dataclass(frozen=True)
class WorkflowFailure:
    """A workflow failure, recorded with its decision: reported once its transaction commits."""

    execution_id: str
    workflow: str
    error_type: str
    message: str
    traceback: str


def report(failures: list[Any], detail: str) -> None:
    """After the commit: each workflow failure as one event, with the frame it raised at."""
    sentry = sdk()
    if sentry is None:
        return
    for failure in failures:
        if isinstance(failure, WorkflowFailure):
            sentry.capture_event(_event(failure, detail))


def _event(failure: WorkflowFailure, detail: str) -> dict[str, Any]:
    frames = [
        {"filename": m["file"], "abs_path": m["file"], "lineno": int(m["line"]), "function": m["function"]}
        for m in _FRAME.finditer(failure.traceback)
    ]
    value = failure.message if detail == "full" else "(message redacted: celery_error_detail is 'type')"
    exception: dict[str, Any] = {"type": failure.error_type, "value": value}
    if frames:
        exception["stacktrace"] = {"frames": frames}
    return {
        "level": "error",
        "logger": "harvest_celery",
        "message": f"workflow {failure.workflow} failed",
        "exception": {"values": [exception]},
        "tags": {"harvest.execution_id": failure.execution_id, "harvest.workflow": failure.workflow},
    }
