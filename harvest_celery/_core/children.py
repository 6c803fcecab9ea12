"""Child workflows and continue-as-new, the pure side (docs/concepts.md, "Child workflows").

A child is started by a command (``ChildWorkflowScheduled``, matched by the command cursor like an
activity dispatch) whose id is decided once and read back on every replay. Its answers are
result events delivered in history order: ``ChildWorkflowStarted`` (the child's run exists),
``ChildWorkflowStartRefused`` (a user-given id that names another run) and
``ChildWorkflowClosed`` (its outcome). ``continue_as_new`` ends the run with a ``ContinuedAsNew``
outcome naming the next link of the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NoReturn, Protocol

from harvest_celery._core import events as ev
from harvest_celery._core.admission import key_of, start_priority
from harvest_celery._core.commands import StartChildWorkflow
from harvest_celery._core.futures import Future
from harvest_celery._core.ids import check_execution_id, child_id, derived_id
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry
from harvest_celery._errors import ChildWorkflowFailed, ExecutionAlreadyExists


class Replay(Protocol):
    """What this module needs of ``_core.replay.Replay`` (which owns a ``Children``)."""

    registry: Registry
    activation: Any
    compensating: int
    commands: list[Any]
    events: list[ev.Event]
    consumed: set[int]

    @property
    def sealed(self) -> bool: ...

    def match(self, kind: type[ev.Event], expected: str, same: Callable[[Any], bool]) -> ev.Event | None: ...

    def _cancelled(self) -> BaseException: ...


TERMINATE, REQUEST_CANCEL, ABANDON = "terminate", "request_cancel", "abandon"
POLICIES = (TERMINATE, REQUEST_CANCEL, ABANDON)
CHILD_EVENTS = (ev.ChildWorkflowStarted, ev.ChildWorkflowStartRefused, ev.ChildWorkflowClosed)


class ChildHandle:
    """A started child (``ctx.start_child_workflow``): ``.id`` at once; await it for the result."""

    __slots__ = ("id", "_future")

    def __init__(self, child: str, future: Future) -> None:
        self.id = child
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def __await__(self) -> Generator[Future, None, Any]:
        return self._future.__await__()

    def __repr__(self) -> str:
        return f"ChildHandle({self.id!r})"


class ContinueAsNew(BaseException):
    """Engine-internal: unwinds the workflow to its outcome (never for workflow code to catch)."""

    def __init__(self, next_id: str, input: Any, signals: tuple[tuple[str, Any], ...]) -> None:
        super().__init__(next_id)
        self.next_id, self.input, self.signals = next_id, input, signals


class Children:
    """One replay's children: their numbers, awaiting futures and delivered answers."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.seq = 0
        self.futures: dict[str, Future] = {}
        self.answers: dict[str, ev.Event] = {}  # child id → its refusal or close, once delivered

    def start(
        self, name: str, input: Any, user_id: str | None, queue: str, policy: str, priority: object = None
    ) -> ChildHandle:
        """Issue one child command; bad input raises before anything is numbered or recorded."""
        replay = self.replay
        definition = replay.registry.workflow(name)  # UnknownWorkflow
        if policy not in POLICIES:
            raise ValueError(f"parent_close_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if user_id is not None:
            check_execution_id(user_id)
            if user_id in self.futures:  # decided from this replay alone: the same on every replay
                raise ExecutionAlreadyExists(user_id, name)
        if not isinstance(queue, str):
            raise TypeError(f"queue is a string, not {type(queue).__name__}")
        payload = check_json(input, f"input of child workflow {name!r}")
        # admission, as a start decides it (``ValueError``, ``InvalidLimitKey``): on every replay,
        # before the command cursor moves, so a refused start is refused alike each time
        level = self._parent_priority() if priority is None else start_priority(priority)
        key = key_of(name, definition.admission, payload)
        self.seq += 1
        recorded = replay.match(
            ev.ChildWorkflowScheduled, f"ChildWorkflowScheduled({name})", lambda e: e.workflow_type == name
        )
        if recorded is None:
            made = user_id if user_id is not None else child_id(replay.activation.execution_id, self.seq)
            replay.commands.append(
                StartChildWorkflow(
                    made,
                    name,
                    payload,
                    queue,
                    policy,
                    replay.compensating > 0,
                    user_id is not None,
                    level,
                    definition.admission.concurrency,
                    key,
                )
            )
        else:
            assert isinstance(recorded, ev.ChildWorkflowScheduled)
            made = recorded.child_id  # replay reads the id back, never derives it again
        future = Future()
        self.futures[made] = future
        if made in self.answers:
            self._resolve(self.answers[made])
        return ChildHandle(made, future)

    def _parent_priority(self) -> int:
        """A child's default start priority: its parent run's (its ``WorkflowStarted``'s)."""
        first = self.replay.events[0] if self.replay.events else None
        return first.priority if isinstance(first, ev.WorkflowStarted) else 0

    def deliver(self, event: ev.Event) -> None:
        if isinstance(event, (ev.ChildWorkflowStartRefused, ev.ChildWorkflowClosed)):
            self.answers.setdefault(event.child_id, event)  # once per child id
            self._resolve(self.answers[event.child_id])

    def _resolve(self, event: ev.Event) -> None:
        assert isinstance(event, (ev.ChildWorkflowStartRefused, ev.ChildWorkflowClosed))
        future = self.futures.get(event.child_id)
        if future is None:
            return
        if isinstance(event, ev.ChildWorkflowStartRefused):
            future.set_exception(ExecutionAlreadyExists(event.child_id, event.existing_workflow_type or "?"))
        elif event.status == "COMPLETED":
            future.set_result(event.result)
        else:
            error = f"{event.error_type}: {event.message}" if event.error_type else None
            future.set_exception(ChildWorkflowFailed(event.child_id, event.status, error))


def continue_as_new(replay: Replay, input: Any) -> NoReturn:
    """End the run CONTINUED_AS_NEW with ``input`` for the next link. Its id is derived from the
    chain's first id and the link's number; the signals never consumed go with it, in order."""
    payload = check_json(input, "input of continue_as_new")
    if replay.sealed:  # nothing continues after a seal: the run is cancelled
        raise replay._cancelled()
    started = replay.events[0]
    assert isinstance(started, ev.WorkflowStarted)
    root = started.chain_id or replay.activation.execution_id
    signals = tuple(
        (e.name, e.payload)
        for i, e in enumerate(replay.events)
        if isinstance(e, ev.SignalReceived) and i not in replay.consumed
    )
    raise ContinueAsNew(derived_id(root, f"n{started.link + 1}"), payload, signals)
