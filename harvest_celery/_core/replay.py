"""One replay of one execution: the deterministic event loop, the command cursor and the
delivery of results (the replay model is described in ``_core.engine``).

The command cursor's candidates, what its command matchers step over and what ``deliver`` does
for each event type all follow the event classes' declarations (``_core.events``).
"""

from __future__ import annotations

import hashlib
import random as _random
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

from harvest_celery._core import children as kids
from harvest_celery._core import events as ev
from harvest_celery._core import updates as ups
from harvest_celery._core.commands import (
    Command,
    RecordMarker,
    ScheduleActivity,
    StartTimer,
)
from harvest_celery._core.futures import Future
from harvest_celery._core.invocation import adopted_task_name, invocation, schema_too_old
from harvest_celery._core.jsonvalues import check_cap, check_json
from harvest_celery._core.limits import DEFAULT_PRIORITY, limit_key_of
from harvest_celery._core.names import (
    PATCH,
    SAGA_COMPENSATED,
    SAGA_COMPENSATION_FAILED,
    CallConvention,
    is_marker,
    marker,
)
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._errors import (
    ActivityError,
    Cancelled,
    CorruptHistory,
    NonDeterministic,
    NotInWorkflow,
    QueryFailed,
)


@dataclass(frozen=True)
class EngineConfig:
    """Live configuration the engine consults (not recorded in history). ``offloads``: would the
    payload pipeline put this value in a payload store (``None``: no store)? The cap applies to
    what is stored inline, and an offloaded value is stored as a reference."""

    max_activity_input_bytes: int | None = 2 * 1024 * 1024
    offloads: Callable[[Any], bool] | None = None
    # the database has the call-convention column (migration 0008): ctx.execute_task may record
    task_calls: bool = True


@dataclass(frozen=True)
class Activation:
    """Everything one decision needs: the run's identity and its history so far."""

    execution_id: str
    workflow_type: str
    history: list[ev.HistoryEvent]
    config: EngineConfig = field(default_factory=EngineConfig)
    # A probe (replayer / canary) is a pure read: frontier arms of observability markers record
    # and count nothing.
    probe: bool = False


class _Task:
    """A coroutine driven by the replay loop."""

    def __init__(self, replay: Replay, coro: Coroutine[Any, Any, Any]) -> None:
        self.replay = replay
        self.coro = coro
        self.future = Future()
        self.update: str | None = None  # the update whose handler this task runs
        replay.tasks.append(self)
        replay.ready.append(self)

    def step(self) -> None:
        replay = self.replay
        replay.running, replay.current_update = True, self.update
        try:
            yielded = self.coro.send(None)
        except StopIteration as stop:
            self.future.set_result(stop.value)
            return
        except RuntimeError as exc:
            # asyncio.sleep(n), wait_for, create_task… look for a running asyncio loop first.
            if "no running event loop" in str(exc):
                self.future.set_exception(_foreign_await("an asyncio primitive"))
            else:
                self.future.set_exception(exc)
            return
        except BaseException as exc:  # noqa: BLE001 - a workflow error becomes the task's outcome
            # BaseException too (SystemExit, KeyboardInterrupt, GeneratorExit, CancelledError, a
            # class of the workflow's own): left to escape, it would wedge the decision worker
            self.future.set_exception(exc)
            return
        finally:
            replay.running, replay.current_update = False, None
        if not isinstance(yielded, Future):
            self.coro.close()
            self.future.set_exception(_foreign_await(repr(yielded)))
            return
        yielded.add_done_callback(lambda _f: replay.ready.append(self))


def _foreign_await(what: str) -> TypeError:
    return TypeError(
        f"a workflow awaited {what}; workflows may only await ctx.* calls "
        "(no asyncio.sleep, asyncio.gather or other event loops): see docs/concepts.md"
    )


class Replay:
    """One replay of one execution. Built fresh for every decision."""

    def __init__(self, definition: WorkflowDefinition, activation: Activation, registry: Registry) -> None:
        if not activation.history or not isinstance(activation.history[0].event, ev.WorkflowStarted):
            raise CorruptHistory("a history starts with WorkflowStarted")
        self.definition = definition
        self.activation = activation
        self.registry = registry
        self.events = [h.event for h in activation.history]
        self.times = [h.recorded_at for h in activation.history]
        self.consumed: set[int] = set()
        # positions a command matcher can meet (declared: ``Event.cursor``), never the first
        self.candidates = [
            i for i, e in enumerate(self.events) if i > 0 and isinstance(e, ev.CANDIDATE_EVENTS)
        ]
        self.cpos = 0
        self.commands: list[Command] = []
        self.nd: NonDeterministic | None = None
        self.ready: deque[_Task] = deque()
        self.tasks: list[_Task] = []
        self.running = False
        self.current_time = self.times[0]
        self.activity_seq = 0
        self.timer_seq = 0
        self.unwind_seq = 0
        self.compensating = 0
        self.activity_names: dict[str, str] = {}
        self.activity_futures: dict[str, Future] = {}
        self.timer_futures: dict[str, Future] = {}
        self.results: dict[str, ev.Event] = {}  # activity id → its delivered result
        self.fired_timers: set[str] = set()
        self.signal_buffer: dict[str, deque[tuple[int, Any]]] = {}
        self.signal_waiters: dict[str, deque[Future]] = {}
        self.children = kids.Children(self)
        cancels = [e for e in self.events if isinstance(e, ev.WorkflowCancelled)]
        self.cancel: ev.WorkflowCancelled | None = cancels[0] if cancels else None
        # a cooperative request, from its delivery on; the seal's position once delivered (what
        # a cancellable wait observes: history order, on every replay)
        # (a deadline's ``WorkflowTimeoutRequested`` is such a request: the first one stands)
        self.cancel_request: ev.WorkflowCancelRequested | ev.WorkflowTimeoutRequested | None = None
        self.seal_delivered = False
        # open cancellable waits: (signal name, future) of a signal wait, (None, timer id) of a
        # sleep
        self.cancellable_waits: list[tuple[str | None, str, Future]] = []
        seed = hashlib.sha256(activation.execution_id.encode()).digest()
        self.rng = _random.Random(int.from_bytes(seed[:8], "big"))
        # ctx.set_query_handler's handlers; the query being answered (``_core.queries``), during
        # which every ctx command is refused, and the first one refused (catching it hides nothing)
        self.query_handlers: dict[str, Callable[[Any], Any]] = {}
        self.query: str | None = None
        self.query_refused: QueryFailed | None = None
        # ctx.set_update_handler's handlers and the update tasks (``_core.updates``); the update
        # whose handler is running now (a Saga refuses to be used from one)
        self.updates = ups.Updates(self)
        self.current_update: str | None = None

    # ── the command cursor ─────────────────────────────────────────────────────────────────
    @property
    def sealed(self) -> bool:
        """A cancelled run is sealed: divergences are raised into the workflow, never nd-block."""
        return self.cancel is not None

    @property
    def cancellation(
        self,
    ) -> ev.WorkflowCancelled | ev.WorkflowCancelRequested | ev.WorkflowTimeoutRequested | None:
        """What ``ctx.is_cancelled()`` reads: the seal, for the whole replay (the spec), else a
        cooperative request from its position in history on."""
        return self.cancel or self.cancel_request

    def _candidates(self, *, skip_signals: bool) -> Iterator[int]:
        """Unconsumed positions from the command cursor that command matchers must look at
        (result and terminal events never are), lazily: matching a command costs O(1) amortised,
        so a replay stays linear in history length."""
        for i in self.candidates[self.cpos :]:
            if i in self.consumed:
                continue
            if skip_signals and isinstance(self.events[i], ev.HELD_EVENTS):
                continue
            yield i

    def _rest(self, *, skip_signals: bool) -> list[int]:
        return list(self._candidates(skip_signals=skip_signals))

    def _consume(self, index: int) -> None:
        self.consumed.add(index)
        while self.cpos < len(self.candidates) and self.candidates[self.cpos] in self.consumed:
            self.cpos += 1

    def _next_command(self) -> int | None:
        return next(self._candidates(skip_signals=True), None)

    def diverge(self, expected: str, index: int | None) -> NonDeterministic:
        actual = ev.describe(self.events[index]) if index is not None else "end of history"
        err = NonDeterministic(
            expected, actual, index if index is not None else len(self.events), self.definition.name
        )
        if self.nd is None and not self.sealed:
            self.nd = err  # recorded when raised: catching it in the workflow hides nothing
        return err

    def match(self, kind: type[ev.Event], expected: str, same: Callable[[Any], bool]) -> ev.Event | None:
        """Match one command: the recorded event, or None at the live frontier."""
        index = self._next_command()
        if index is None:
            return None
        event = self.events[index]
        if isinstance(event, kind) and same(event):
            self._consume(index)
            return event
        raise self.diverge(expected, index)

    # ── commands the context issues ──────────────────────────────────────────────────────────
    def check_running(self, api: str) -> None:
        if self.query is not None:  # a query handler: it reads state, it never issues a command
            refused = QueryFailed(
                self.activation.execution_id,
                self.query,
                "QueryCommand",
                f"a query handler may not call {api} (a query reads state; it never schedules, "
                "sleeps, waits, starts or records anything)",
                api,
            )
            self.query_refused = self.query_refused or refused
            raise refused
        if self.updates.validating is not None:  # a validator reads state; it issues nothing
            raise self.updates.refuse(api)
        if not self.running:
            raise NotInWorkflow(api)

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
    ) -> Future:
        definition = self.registry.activity(name)
        what = f"input of activity {name!r}"
        payload = check_json(input, what)
        key = None
        if not self.recorded_next(name, node):
            # A deterministic pre-dispatch rejection: before an id is allocated or anything
            # recorded, so it is re-decided on every replay. A recorded dispatch is never
            # re-checked: lowering the cap cannot strand a run, and limit_key is never called.
            config = self.activation.config
            check_cap(payload, what, config.max_activity_input_bytes, config.offloads)
            key = limit_key_of(name, definition.limits, payload)
        resolved_queue = definition.resolve_queue(queue)
        self.activity_seq += 1
        activity_id = str(self.activity_seq)
        # a call recorded by execute_activity and replayed by execute_task (or back) diverges,
        # as a change of activity name does
        recorded = self.match(
            ev.ActivityScheduled,
            f"ActivityScheduled({name})"
            if call_convention is None
            else f"ActivityScheduled({name}, task call)",
            lambda e: e.activity_name == name and e.call_convention == call_convention and e.node == node,
        )
        if recorded is None:
            self.commands.append(
                ScheduleActivity(
                    activity_id,
                    name,
                    payload,
                    resolved_queue,
                    self.compensating > 0,
                    retry,
                    start_to_close,
                    call_convention=call_convention,
                    node=node,
                    priority=priority,
                    limit_key=key,
                )
            )
        else:
            assert isinstance(recorded, ev.ActivityScheduled)
            activity_id = recorded.activity_id
        future = Future()
        self.activity_names[activity_id] = name
        self.activity_futures[activity_id] = future
        if activity_id in self.results:
            self._resolve_activity(self.results[activity_id])
        return future

    def schedule_task(self, task: Any, args: Any, kwargs: Any, queue: str | None) -> Future:
        """``ctx.execute_task``: a durable call of an adopted task Celery's way."""
        name = adopted_task_name(self.registry, task)
        if not self.recorded_next(name) and not self.activation.config.task_calls:
            raise schema_too_old()
        call = invocation(name, args, kwargs)
        started = self.events[0]  # the run's start priority, as execute_activity's default
        return self.schedule_activity(
            name,
            call,
            queue or "",
            call_convention=CallConvention.ARGS_KWARGS.value,
            priority=getattr(started, "priority", DEFAULT_PRIORITY),
        )

    def start_child(
        self, name: str, input: Any, child_id: str | None, queue: str, policy: str, priority: object = None
    ) -> kids.ChildHandle:
        return self.children.start(name, input, child_id, queue, policy, priority)

    def continue_as_new(self, input: Any) -> NoReturn:
        kids.continue_as_new(self, input)

    def start_timer(self, seconds: float, cancellable: bool = False) -> Future:
        """A durable timer. ``cancellable``: a cancellation (a request, a deadline's, or the seal)
        delivered before its ``TimerFired`` — in history order — raises ``Cancelled`` instead;
        the timer still fires later, delivered to nobody. One delivered already raises at once,
        and no timer is started."""
        if seconds < 0:
            raise ValueError("ctx.sleep() needs a non-negative number of seconds")
        if cancellable and self.cancellation_delivered:
            future = Future()
            future.set_exception(self._cancelled())
            return future
        self.timer_seq += 1
        timer_id = str(self.timer_seq)
        recorded = self.match(ev.TimerStarted, f"TimerStarted({timer_id})", lambda e: True)
        if recorded is None:
            fire_at = (self.current_time + timedelta(seconds=seconds)).isoformat()
            self.commands.append(StartTimer(timer_id, float(seconds), fire_at))
        else:
            assert isinstance(recorded, ev.TimerStarted)
            timer_id = recorded.timer_id
        future = Future()
        self.timer_futures[timer_id] = future
        if timer_id in self.fired_timers:
            future.set_result(None)
        elif cancellable:
            self.cancellable_waits.append((None, timer_id, future))
        return future

    def check_inputs(self, name: str, inputs: Any) -> list[Any]:
        """The pre-dispatch checks of ``schedule_activity`` for a whole fan-out at once, so a bad
        cell rejects the node before any cell is recorded."""
        what = f"input of activity {name!r}"
        config = self.activation.config
        cap = None if self.recorded_next(name) else config.max_activity_input_bytes
        checked = []
        for i, item in enumerate(inputs):
            payload = check_json(item, what)
            check_cap(payload, f"{what} (cell {i})", cap, config.offloads)
            checked.append(payload)
        return checked

    def recorded_next(self, activity_name: str, node: str | None = None) -> bool:
        """Is the next command event a dispatch of ``activity_name`` (a replayed dispatch), for
        canvas node ``node`` when one is given?"""
        index = self._next_command()
        event = self.events[index] if index is not None else None
        return (
            isinstance(event, ev.ActivityScheduled)
            and event.activity_name == activity_name
            and (node is None or event.node == node)
        )

    def unwind_recorded_next(self) -> bool:
        """Does the next command event begin an unwind (its saga marker, or a compensation
        dispatch of an uncounted one)? I.e. an unwind recorded before a seal, to replay."""
        index = self._next_command()
        event = self.events[index] if index is not None else None
        if isinstance(event, ev.MarkerRecorded):
            return is_marker(event.name, SAGA_COMPENSATED)
        return isinstance(event, (ev.ActivityScheduled, ev.ChildWorkflowScheduled)) and event.compensation

    def patched(self, patch_id: str) -> bool:
        """``patch:{id}`` marker with an Absent arm: histories recorded before the patch replay
        the old branch. A trailing ``WorkflowCancelled`` is transparent here, as for the saga
        markers, so the answer a post-cancel decision recorded reads back the same."""
        name = marker(PATCH, patch_id)
        rest = self._rest(skip_signals=True)
        if rest and isinstance(self.events[rest[0]], ev.WorkflowCancelled):
            rest = rest[1:]
        if not rest:
            if not self.activation.probe:
                self.commands.append(RecordMarker(name))
            return True
        event = self.events[rest[0]]
        if isinstance(event, ev.MarkerRecorded) and event.name == name:
            self._consume(rest[0])
            return True
        return False

    def wait_signal(self, name: str, cancellable: bool = False) -> Future:
        """The next signal ``name``. ``cancellable``: a cancellation (a request, or the seal)
        delivered first — before the signal, in history order — raises ``Cancelled`` instead."""
        future = Future()
        buffered = self.signal_buffer.get(name)
        if buffered:
            index, payload = buffered.popleft()
            self._consume(index)
            future.set_result(payload)
        elif cancellable and self.cancellation_delivered:
            future.set_exception(self._cancelled())
        else:
            self.signal_waiters.setdefault(name, deque()).append(future)
            if cancellable:
                self.cancellable_waits.append((name, "", future))
        return future

    @property
    def cancellation_delivered(self) -> bool:
        """A cancellation (a request, a deadline's, or the seal) is delivered at this point of
        the replay: what a cancellable wait begun now observes."""
        return self.cancel_request is not None or self.seal_delivered

    def _cancelled(self) -> Cancelled:
        found = self.cancellation
        return Cancelled((found.reason if found is not None else "") or "cancelled")

    def _wake_cancellable(self) -> None:
        """A cancellation was delivered: every cancellable wait still open raises ``Cancelled``
        (a signal wait gives up its place in the signal queue, a sleep its timer)."""
        waits, self.cancellable_waits = self.cancellable_waits, []
        for name, timer_id, future in waits:
            if future.done():
                continue
            if name is None:  # a sleep: its TimerFired, when it comes, is delivered to nobody
                self.timer_futures.pop(timer_id, None)
            else:
                self.signal_waiters[name].remove(future)
            future.set_exception(self._cancelled())

    # ── saga observability markers ────────────────────────────────────────────────────────────
    def saga_unwind_started(self, workflow_label: str) -> tuple[int, bool]:
        """Number the unwind and decide, once, whether it is counted."""
        self.unwind_seq += 1
        seq = self.unwind_seq
        name = marker(SAGA_COMPENSATED, seq)
        rest = self._rest(skip_signals=False)
        counted = self._observe_marker(name, rest, SAGA_COMPENSATED)
        if counted is None:
            # Drained signal frontier (all remaining are un-awaited signals), or unconsumed
            # events at the cursor (a history recorded before the markers existed): uncounted.
            return seq, False
        return seq, counted

    def saga_unwind_failed(self, seq: int) -> None:
        """Failure marker of a counted unwind: recorded even past a trailing signal."""
        self._observe_marker(
            marker(SAGA_COMPENSATION_FAILED, seq), self._rest(skip_signals=True), SAGA_COMPENSATION_FAILED
        )

    def _observe_marker(self, name: str, rest: list[int], metric: str) -> bool | None:
        """Frontier → record (and count); recorded → consume silently; else None (Absent arm).

        A trailing ``WorkflowCancelled`` is transparent here (and only here): the unwind of a
        freshly cancelled run is the live frontier.
        """
        if rest and isinstance(self.events[rest[0]], ev.WorkflowCancelled):
            rest = rest[1:]
        if not rest:
            if self.activation.probe:
                return False
            self.commands.append(RecordMarker(name, metric=metric))
            return True
        event = self.events[rest[0]]
        if isinstance(event, ev.MarkerRecorded) and event.name == name:
            self._consume(rest[0])
            return True
        return None

    # ── delivery of results ──────────────────────────────────────────────────────────────────
    def _resolve_activity(self, event: ev.Event) -> None:
        assert isinstance(event, (ev.ActivityCompleted, ev.ActivityFailed))
        future = self.activity_futures.get(event.activity_id)
        if future is None:
            return
        if isinstance(event, ev.ActivityCompleted):
            future.set_result(event.output)
        else:
            name = self.activity_names.get(event.activity_id, "?")
            future.set_exception(ActivityError(name, event.error_type, event.message, event.attempt))

    def deliver(self, index: int) -> None:
        event = self.events[index]
        self.current_time = self.times[index]
        match ev.known(event):
            case ev.ActivityCompleted() | ev.ActivityFailed() as result:
                self.results[result.activity_id] = result
                self._resolve_activity(result)
            case ev.TimerFired(timer_id=timer_id):
                self.fired_timers.add(timer_id)
                timer = self.timer_futures.get(timer_id)
                if timer is not None:
                    timer.set_result(None)
            case ev.SignalReceived(name=name, payload=payload):
                waiters = self.signal_waiters.get(name)
                if waiters:
                    self._consume(index)
                    waiters.popleft().set_result(payload)
                else:
                    self.signal_buffer.setdefault(name, deque()).append((index, payload))
            case ev.WorkflowCancelRequested() | ev.WorkflowTimeoutRequested() as request:
                if self.cancel_request is None:  # a second request changes nothing (its reason stands)
                    self.cancel_request = request
                    self._wake_cancellable()
            case ev.WorkflowCancelled():
                self.seal_delivered = True
                self._wake_cancellable()
            case ev.ChildWorkflowStartRefused() | ev.ChildWorkflowClosed():
                self.children.deliver(event)
            case ev.UpdateAccepted() as accepted:
                handler = self.updates.accepted(index, accepted)
                if handler is not None:  # its task runs beside the workflow's
                    task = _Task(self, handler)
                    task.update = accepted.update_id
                    task.future.add_done_callback(lambda f: self.updates.completed(accepted, f))
            case (
                ev.ActivityScheduled()
                | ev.MarkerRecorded()
                | ev.TimerStarted()
                | ev.ChildWorkflowScheduled()
                | ev.UpdateCompleted()
            ):
                pass  # command events: met by the command cursor, nothing to deliver
            case ev.ChildWorkflowStarted():
                pass  # the child runs: what the parent awaits is its close
            case (
                ev.ActivityStarted()
                | ev.WorkflowStarted()
                | ev.WorkflowCompleted()
                | ev.WorkflowFailed()
                | ev.WorkflowContinuedAsNew()
            ):
                pass  # a start is not a result; the outcome ends the replay
            case other:
                ev.unhandled(other)

    def close(self) -> None:
        """Drop coroutines still suspended (a blocked workflow): their frames must not outlive the
        decision. Errors raised by their cleanup are the workflow's, and are not ours to report."""
        for task in self.tasks:
            if not task.future.done():
                try:
                    task.coro.close()
                except BaseException:  # noqa: BLE001
                    pass

    def run_ready(self) -> None:
        while self.ready:
            self.ready.popleft().step()

    def spawn(self, awaitable: Awaitable[Any]) -> Future:
        if isinstance(awaitable, Future):
            return awaitable

        async def _wrap() -> Any:
            return await awaitable

        task = _Task(self, _wrap())
        task.update = self.current_update  # spawned by an update handler: still its code
        return task.future
