"""Existing Celery tasks used as activities by name.

An adopted task keeps its signature, so it receives the activity input as its one positional
argument (the payload transits the broker, unlike engine-native activities) and its ids travel in
the ``harvest`` message header. The same claim guards its body: the task's ``run`` is wrapped so
that it refuses to run unless the pre-run claim committed.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from celery import Celery, signals

from harvest_celery._core.registry import ActivityDefinition

if TYPE_CHECKING:
    from harvest_celery._runtime.runtime import Runtime

log = logging.getLogger("harvest_celery")


def _ref(task: Any) -> dict[str, Any] | None:
    request = task.request
    ref = getattr(request, "harvest", None)
    if ref is None:
        headers = getattr(request, "headers", None) or {}
        ref = headers.get("harvest")
    return ref if isinstance(ref, dict) else None


def adopt(app: Celery, runtime: Runtime, definition: ActivityDefinition) -> None:
    """Guard an existing task (registered on ``app`` now or later) with the claim."""

    def guard(task: Any) -> None:
        if getattr(task, "_harvest_adopted", False):
            return
        original = task.run

        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            ref = _ref(task)
            if ref is None:
                return original(*args, **kwargs)  # an ordinary call, not dispatched by harvest
            claim = runtime.claim(ref["execution_id"], ref["activity_id"], int(ref["attempt"]))
            if claim is None:
                log.info("adopted task %s: claim refused, body skipped", definition.name)
                return None
            runtime.execute(claim, lambda value: original(value))
            return None

        task.run = guarded
        task._harvest_adopted = True

    if definition.name in app.tasks:
        guard(app.tasks[definition.name])

    def on_worker_init(**_kw: Any) -> None:
        if definition.name in app.tasks:
            guard(app.tasks[definition.name])
        else:
            log.error("adopted activity %r is not a task registered on this Celery app", definition.name)

    signals.worker_init.connect(on_worker_init, weak=False)
