"""``WorkflowContext``: the only door from workflow code to the world.

Every method is deterministic on replay: it either reads the recorded history or issues a command
that the engine matches against it. See docs/concepts.md, "Determinism rules".
"""

from __future__ import annotations

import inspect
import random as _random
import uuid as _uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, Protocol

from harvest_celery._core.futures import Future
from harvest_celery._core.limits import DEFAULT_PRIORITY, check_priority
from harvest_celery._core.registry import activity_name, workflow_name
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._errors import Cancelled


@dataclass(frozen=True)
class WorkflowInfo:
    execution_id: str
    workflow_type: str
    started_at: datetime
    # nodes a DAG retry-from-node carried over from its source run: {node: {input, output}}
    carried: Mapping[str, Any] = field(default_factory=dict)
    # the nominal tick of a scheduled run (the trigger time of a trigger-now); None otherwise
    scheduled_for: datetime | None = None
    priority: int = 0  # the start priority: the default of its activities' (docs/flow-control.md)


class ReplayPort(Protocol):
    """What the context needs from the replay that drives it (``_core.replay.Replay`` implements
    it). The context depends on this port, never on the engine, so the two form no cycle."""

    current_time: datetime
    rng: _random.Random
    compensating: int
    query_handlers: dict[str, Callable[[Any], Any]]
    updates: Any  # ``_core.updates.Updates``
    current_update: str | None

    @property
    def cancellation(self) -> Any: ...

    @property
    def sealed(self) -> bool: ...

    def check_running(self, api: str) -> None: ...

    def schedule_activity(
        self,
        name: str,
        input: Any,
        queue: str,
        *,
        retry: RetryPolicy | None = None,
        start_to_close: float | None = None,
        call_convention: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        node: str | None = None,
    ) -> Future: ...

    def schedule_task(self, task: Any, args: Any, kwargs: Any, queue: str | None) -> Future: ...

    def check_inputs(self, name: str, inputs: Sequence[Any]) -> list[Any]: ...

    def start_timer(self, seconds: float, cancellable: bool = False) -> Future: ...

    def wait_signal(self, name: str, cancellable: bool = False) -> Future: ...

    def recorded_next(self, activity_name: str, node: str | None = None) -> bool: ...

    def unwind_recorded_next(self) -> bool: ...

    def spawn(self, awaitable: Awaitable[Any]) -> Future: ...

    def patched(self, patch_id: str) -> bool: ...

    def saga_unwind_started(self, workflow_label: str) -> tuple[int, bool]: ...

    def saga_unwind_failed(self, seq: int) -> None: ...

    def start_child(
        self, name: str, input: Any, child_id: str | None, queue: str, policy: str, priority: object = None
    ) -> Any: ...

    def continue_as_new(self, input: Any) -> NoReturn: ...


class Unwind:
    """One compensation unwind in progress (see ``WorkflowContext.unwinding``)."""

    def __init__(self, replay: ReplayPort, seq: int, counted: bool) -> None:
        self._replay = replay
        self.seq = seq
        self.counted = counted

    def failed(self) -> None:
        """The unwind ended with compensation errors: record ``saga_compensation_failed:{seq}``
        (a counted unwind only)."""
        if self.counted:
            self._replay.saga_unwind_failed(self.seq)


class WorkflowContext:
    """Handed to every workflow function as its first argument."""

    def __init__(self, replay: ReplayPort, info: WorkflowInfo) -> None:
        self._replay = replay
        self.info = info

    # ── activities, timers, signals ─────────────────────────────────────────────────────────
    def execute_activity(
        self,
        activity: Any,
        input: Any = None,
        queue: str = "",
        *,
        retry: RetryPolicy | None = None,
        start_to_close: float | None = None,
        priority: int | None = None,
    ) -> Future:
        """Dispatch an activity (a decorated function or its name) and return an awaitable of its
        output. ``queue`` empty → the activity's default queue → ``"default"``. ``priority``: an
        int from 0 to 9, 9 first, ordering what waits for a limit (docs/flow-control.md); the
        run's start priority by default.

        Raises ``UnknownActivity``, ``PayloadNotSerializable``, ``PayloadTooLarge``,
        ``InvalidLimitKey`` or (a bad priority) ``ValueError`` before anything is recorded;
        awaiting raises ``ActivityError`` if the activity failed for good.
        """
        self._replay.check_running("ctx.execute_activity")
        chosen = self.info.priority if priority is None else check_priority(priority)
        return self._replay.schedule_activity(
            activity_name(activity),
            input,
            queue,
            retry=retry,
            start_to_close=start_to_close,
            priority=chosen,
        )

    def execute_task(self, task: Any, *args: Any, queue: str | None = None, **kwargs: Any) -> Future:
        """Call an existing Celery task adopted with ``harvest.adopt_task`` (the task object or
        its name) durably, exactly as Celery would: ``task(*args, **kwargs)``. The call
        ``{"args", "kwargs"}`` is recorded as the input; returns an awaitable of the task's
        return value. ``queue`` is the one reserved keyword (None: the adopted definition's,
        then ``"default"``); the retry policy and start_to_close are ``adopt_task``'s.

        Raises ``UnknownActivity``, ``PayloadNotSerializable``, ``PayloadTooLarge`` or
        ``InvalidTaskCall`` (a signature, or a schema older than the call convention) before
        anything is recorded; awaiting raises ``ActivityError`` if the task failed for good.
        """
        self._replay.check_running("ctx.execute_task")
        return self._replay.schedule_task(task, args, kwargs, queue)

    def execute_node(
        self,
        task: str,
        input: Any,
        queue: str,
        node: str,
        call_convention: str,
        *,
        retry: RetryPolicy | None = None,
    ) -> Future:
        """The canvas runner's dispatch (``harvest.start_canvas``): the adopted task ``task``
        called with its recorded ``input`` under ``call_convention``, the dispatch keyed by the
        canvas node ``node`` (recorded on its ``ActivityScheduled``, never inside the input)."""
        self._replay.check_running("ctx.execute_node")
        return self._replay.schedule_activity(
            task, input, queue, retry=retry, call_convention=call_convention, node=node
        )

    def check_activity_inputs(self, activity: Any, inputs: Sequence[Any]) -> list[Any]:
        """Check every input a fan-out is about to dispatch, before any is recorded: raises
        ``PayloadNotSerializable`` or ``PayloadTooLarge`` for the first bad one (a dispatch the
        history already records is never re-checked against the cap). Returns the inputs as they
        will read back from history."""
        self._replay.check_running("ctx.check_activity_inputs")
        return self._replay.check_inputs(activity_name(activity), inputs)

    def sleep(self, seconds: float, *, cancellable: bool = False) -> Future:
        """A durable timer: survives worker restarts; fired by the sweeper from Postgres.
        ``cancellable=True``: if a cancellation — a cooperative request, a deadline's timeout
        request, or the seal — arrives before the timer fires (in history order), the await
        raises ``Cancelled`` instead; the timer still fires later, delivered to nobody."""
        self._replay.check_running("ctx.sleep")
        return self._replay.start_timer(seconds, cancellable)

    def wait_signal(self, name: str, *, cancellable: bool = False) -> Future:
        """Await the next signal called ``name`` (signals are buffered until awaited; see
        ``Harvest.signal``). ``cancellable=True``: if a cancellation — a cooperative request, or
        the seal — arrives before the signal (in history order), the await raises ``Cancelled``
        instead, so a workflow parked on a signal can react to a cancel."""
        self._replay.check_running("ctx.wait_signal")
        return self._replay.wait_signal(name, cancellable)

    async def gather(self, *awaitables: Awaitable[Any]) -> list[Any]:
        """Run awaitables concurrently and return their results in argument order.

        Every member is dispatched in argument order and the join settles only when all of them
        have a result — never at the first failure — so live and replay build the same state.
        The first failure in argument order is then raised.
        """
        self._replay.check_running("ctx.gather")
        futures = [self._replay.spawn(a) for a in awaitables]
        if futures:
            join = Future()
            remaining = [len(futures)]

            def settled(_f: Future) -> None:
                remaining[0] -= 1
                if remaining[0] == 0:
                    join.set_result(None)

            for f in futures:
                f.add_done_callback(settled)
            await join
        return [f.result() for f in futures]

    # ── child workflows, continue-as-new (docs/concepts.md, "Child workflows") ──────────────
    def execute_child_workflow(
        self,
        workflow: Any,
        input: Any = None,
        id: str | None = None,
        queue: str = "",
        *,
        parent_close_policy: str = "terminate",
        priority: int | None = None,
    ) -> Future:
        """Start a child workflow (a ``@workflow`` function or its name) and return an awaitable
        of its result. ``id``: the child's id (default ``<parent>-c<n>``); ``queue``: its
        decision queue; ``parent_close_policy``: ``"terminate"``, ``"request_cancel"`` or
        ``"abandon"``; ``priority``: its start priority, 0–9 (default: this run's). A child of
        a limited workflow passes admission as any start does (docs/flow-control.md): it may
        wait for a slot, and this await waits with it.

        Raises ``UnknownWorkflow``, ``InvalidExecutionId``, ``ValueError`` (a policy, a
        priority), ``InvalidLimitKey`` (the child's ``limit_key``) or ``PayloadNotSerializable``
        before anything is recorded; awaiting raises ``ChildWorkflowFailed`` if the child did
        not complete, ``ExecutionAlreadyExists`` if a given ``id`` names another run.
        """
        return self.start_child_workflow(
            workflow, input, id, queue, parent_close_policy=parent_close_policy, priority=priority
        )._future

    def start_child_workflow(
        self,
        workflow: Any,
        input: Any = None,
        id: str | None = None,
        queue: str = "",
        *,
        parent_close_policy: str = "terminate",
        priority: int | None = None,
    ) -> Any:
        """As ``execute_child_workflow``, but returns a handle at once: its ``.id``, and awaiting
        it gives the child's result."""
        self._replay.check_running("ctx.start_child_workflow")
        return self._replay.start_child(
            workflow_name(workflow), input, id, queue, parent_close_policy, priority
        )

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """End this run as CONTINUED_AS_NEW and start the next run of the chain with ``input``
        (its id derived from the chain's first id). Never returns. Signals this run never
        consumed are carried over, in order. Raises ``PayloadNotSerializable`` for an input
        that is not JSON, ``Cancelled`` on a sealed run."""
        self._replay.check_running("ctx.continue_as_new")
        self._replay.continue_as_new(input)

    # ── cancellation ─────────────────────────────────────────────────────────────────────────
    def is_cancelled(self) -> bool:
        """True for the whole replay once the run is sealed by a cancel (``WorkflowCancelled``);
        with a cooperative request (``Harvest.request_cancellation``), true from the request's
        position in history on — the same on every replay."""
        return self._replay.cancellation is not None

    def is_sealed(self) -> bool:
        """True once the run is sealed by ``cancel_workflow_execution``: no durable work can be
        scheduled any more (a dispatch diverges against the seal), so a cancel branch can only
        compensate in memory. False for a cooperative request, which leaves the run live."""
        return self._replay.sealed

    def cancellation_reason(self) -> str | None:
        found = self._replay.cancellation
        return found.reason if found is not None else None

    def check_cancellation(self) -> None:
        """Raise ``Cancelled`` if the run was cancelled. Runs no compensation."""
        found = self._replay.cancellation
        if found is not None:
            raise Cancelled(found.reason or "cancelled")

    # ── versioning and deterministic helpers ────────────────────────────────────────────────
    def patched(self, patch_id: str) -> bool:
        """True on new runs (records ``patch:{id}``); False when replaying a history recorded
        before the patch existed."""
        self._replay.check_running("ctx.patched")
        return self._replay.patched(patch_id)

    def now(self) -> datetime:
        """Workflow time: the recorded time of the last history event delivered to the workflow."""
        return self._replay.current_time

    def random(self) -> float:
        """A deterministic pseudo-random float, seeded by the execution id."""
        return self._replay.rng.random()

    def uuid4(self) -> _uuid.UUID:
        """A deterministic UUID4, seeded by the execution id."""
        return _uuid.UUID(int=self._replay.rng.getrandbits(128), version=4)

    @property
    def rng(self) -> _random.Random:
        return self._replay.rng

    # ── queries (docs/concepts.md, "Queries") ───────────────────────────────────────────────
    def set_query_handler(self, name: str, handler: Callable[[Any], Any] | None) -> None:
        """Answer ``Harvest.query(run_id, name, arg)`` with ``handler(arg)``: a plain function
        from a JSON argument to a JSON value that reads the workflow's state (its locals, by
        closure). It runs on a replay built for the query and dropped after it, so nothing it
        changes is seen by any decision; a ``ctx`` command in it fails the query
        (``QueryFailed``). A later call with the same name replaces the handler; ``None``
        removes it. Registering is not recorded: it holds from where the code reaches it, on
        every replay. Raises ``TypeError`` for a handler that is not a plain callable."""
        self._replay.check_running("ctx.set_query_handler")
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"a query name is a non-empty string, not {name!r}")
        if handler is None:
            self._replay.query_handlers.pop(name, None)
            return
        if not callable(handler) or inspect.iscoroutinefunction(handler):
            raise TypeError(
                f"the handler of query {name!r} must be a plain function (not async): a query "
                "answers from the run's state at once and may not await"
            )
        self._replay.query_handlers[name] = handler

    # ── updates (docs/concepts.md, "Updates") ───────────────────────────────────────────────
    def set_update_handler(
        self,
        name: str,
        handler: Callable[[Any], Any] | None,
        validator: Callable[[Any], Any] | None = None,
    ) -> None:
        """Run ``handler(arg)`` for each ``Harvest.update(run_id, name, arg)`` the run accepts:
        a function or an ``async`` function that may change the workflow's state and await
        activities, timers and signals (as a task beside the workflow's, replayed at the
        position of its ``UpdateAccepted``); its JSON return value is the caller's answer, an
        error it raises the caller's ``UpdateFailed``. ``validator(arg)``, a plain function,
        runs first, on a replay built for the call under the run's lock: raising rejects the
        update (``UpdateRejected``) and nothing is written; it may issue no ``ctx`` command. A
        later call with the same name replaces the handler; ``None`` removes it. Registering is
        not recorded: it holds from where the code reaches it, on every replay."""
        self._replay.check_running("ctx.set_update_handler")
        self._replay.updates.register(name, handler, validator)

    def check_not_in_update(self, api: str) -> None:
        """Refuse ``api`` (a ``Saga``) inside an update handler: saga + update is out of scope
        (docs/concepts.md, "Updates")."""
        update = self._replay.current_update
        if update is not None:
            raise TypeError(
                f"{api} may not be used from an update handler (update {update!r}): a saga's "
                "compensations belong to the workflow's own code; saga + update is out of scope"
            )

    # ── replay introspection (the DAG runner's cancel edges) ─────────────────────────────────
    def dispatch_recorded(self, activity: Any) -> bool:
        """Whether the next command this run recorded is a dispatch of ``activity``: a replayed
        dispatch, not a new one (once cancelled, a DAG dispatches nothing new)."""
        return self._replay.recorded_next(activity_name(activity))

    def node_recorded(self, task: str, node: str) -> bool:
        """``dispatch_recorded`` for a canvas node: the next command is ``task``'s dispatch of
        ``node``."""
        return self._replay.recorded_next(task, node)

    def unwind_recorded(self) -> bool:
        """Whether the next command this run recorded begins an unwind: one that began before a
        seal cancel, which replays (and fails past the seal), as a hand-written saga's would."""
        return self._replay.unwind_recorded_next()

    # ── compensation helpers (Saga, the DAG unwind) ─────────────────────────────────────────────
    @contextmanager
    def unwinding(self) -> Iterator[Unwind]:
        """Scope of one compensation unwind: numbers it, decides once whether it is counted
        (``saga_compensated:{seq}``), and marks activities dispatched inside it as compensations.
        Call ``Unwind.failed()`` if a compensation failed."""
        seq, counted = self._replay.saga_unwind_started(self.info.workflow_type)
        self._replay.compensating += 1
        try:
            yield Unwind(self._replay, seq, counted)
        finally:
            self._replay.compensating -= 1
