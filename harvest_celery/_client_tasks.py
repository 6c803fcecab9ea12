"""Existing Celery tasks started durably: ``Harvest.start_task`` (docs/concepts.md, "Adopted
Celery tasks"). A one-step run of the reserved built-in workflow ``harvest.start_task``, which
waits on a durable timer if the call has a countdown or eta, then calls the adopted task."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core.ids import check_execution_id
from harvest_celery._core.invocation import (
    START_TASK,
    adopted_task_name,
    call_options,
    invocation,
    is_signature,
    schema_too_old,
    signature_call,
    start_task_input,
    task_name,
)
from harvest_celery._core.jsonvalues import check_cap
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._dag.canvas import CANVAS
from harvest_celery._dag.canvas_compile import compile_canvas
from harvest_celery._errors import InvalidTaskCall
from harvest_celery._store import starts
from harvest_celery._store.appconn import payloads_on
from harvest_celery._store.records import utcnow
from harvest_celery._store.starts import check_policy


class Tasks(ClientBase):
    """``Harvest``'s durable starts of existing Celery tasks and canvases."""

    def start_canvas(
        self,
        signature: Any,
        *,
        execution_id: str | None = None,
        compensate: dict[str, Any] | None = None,
        retry: RetryPolicy | dict[str, RetryPolicy] | None = None,
        id_reuse: str = "idempotent",
    ) -> str:
        """Start a durable run of a Celery canvas (``chain``, ``group``, ``chord``, ``chunks``,
        ``starmap``/``xmap``, nested) on the adopted tasks it names, and return its id
        (docs/canvas.md). The canvas is compiled once, here, to its canonical graph (node ids are
        canvas paths), stored as the run's input; ``harvest.result(id)`` is what
        ``apply_async().get()`` returns with the JSON serializer.

        ``compensate``: ``{task: undo task}`` (the undo receives the task's result) or ``{task:
        {"task": undo, "receives": "envelope"}}`` (the whole envelope). ``retry``: one
        ``RetryPolicy`` for every node, or ``{task: RetryPolicy}``. The same canvas (frozen or
        not) under the same ``execution_id`` is the same run; another raises
        ``ExecutionAlreadyExists(conflict="input")``.

        Raises ``CanvasNotSupported``, ``InvalidTaskCall``, ``UnknownActivity``,
        ``PayloadNotSerializable``, ``PayloadTooLarge`` or ``InvalidExecutionId`` and writes
        nothing."""
        graph = compile_canvas(signature, self.registry, compensate, retry)
        engine = self.runtime.settings.engine
        for node in graph["nodes"]:
            what = f"input of activity {node['task']!r} (canvas node {node['id']})"
            check_cap(node["call"], what, engine.max_activity_input_bytes, engine.offloads)
        execution_id = check_execution_id(execution_id or uuid.uuid4().hex)
        check_policy(id_reuse)
        if not self.store.has_call_convention():
            raise schema_too_old()
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            starts.start(
                tx,
                execution_id,
                CANVAS,
                graph,
                utcnow(),
                self.runtime.settings.decision_queue,
                id_reuse=id_reuse,
            )
        self._after(tx)
        return execution_id

    def start_task(
        self,
        signature_or_task: Any,
        *args: Any,
        execution_id: str | None = None,
        id_reuse: str = "idempotent",
        queue: str | None = None,
        scheduled_for: datetime | None = None,
        **kwargs: Any,
    ) -> str:
        """Start a durable one-step run calling an adopted Celery task exactly as Celery would,
        and return its id (``execution_id``, or a new uuid). ``harvest.result(id)`` is the
        task's return value; a failure is ``WorkflowFailed``.

        ``signature_or_task``: a task (or its name) called with ``*args``/``**kwargs``, or a
        signature, whose args, kwargs and options are used (extra args are prepended and extra
        kwargs merged for a partial ``.s``; an immutable ``.si`` given more is refused).
        ``execution_id``, ``id_reuse`` (as ``start_workflow``'s), ``queue`` and
        ``scheduled_for`` (recorded in ``WorkflowStarted``, as ``start_workflow``'s) are
        reserved: never passed to the task. Options: ``queue``, ``countdown`` and ``eta`` (a durable timer)
        are honoured; the rest are dropped or refused (docs/concepts.md, the options table).

        Raises ``UnknownActivity``, ``PayloadNotSerializable``, ``PayloadTooLarge``,
        ``InvalidTaskCall`` or ``InvalidExecutionId`` and writes nothing."""
        options: dict[str, Any] = {}
        if is_signature(signature_or_task):
            name, args_, kwargs_, options = signature_call(signature_or_task, args, kwargs)
        else:
            name, args_, kwargs_ = task_name(signature_or_task), list(args), dict(kwargs)
        adopted_task_name(self.registry, name)
        if scheduled_for is not None and (
            not isinstance(scheduled_for, datetime) or scheduled_for.tzinfo is None
        ):
            raise ValueError(f"scheduled_for is an aware datetime, not {scheduled_for!r}")
        chosen = call_options(options)
        for reserved in ("queue", "scheduled_for"):
            if reserved in kwargs_:
                raise InvalidTaskCall(reserved, f"{reserved} is a reserved keyword of a durable task call")
        call = invocation(name, args_, kwargs_)
        engine = self.runtime.settings.engine
        check_cap(call, f"input of activity {name!r}", engine.max_activity_input_bytes, engine.offloads)
        execution_id = check_execution_id(execution_id or uuid.uuid4().hex)
        check_policy(id_reuse)
        if not self.store.has_call_convention():
            raise schema_too_old()
        payload = start_task_input(name, call, queue or chosen.queue, chosen)
        with self.store.begin() as tx:
            tx.payloads = payloads_on(self.store, tx.conn)
            starts.start(
                tx,
                execution_id,
                START_TASK,
                payload,
                utcnow(),
                self.runtime.settings.decision_queue,
                id_reuse=id_reuse,
                scheduled_for=scheduled_for,
            )
        self._after(tx)
        return execution_id
