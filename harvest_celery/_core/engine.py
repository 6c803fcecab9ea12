"""The pure decision engine: (definition, history) → commands.

No database, no Celery, no wall clock. ``decide`` runs the workflow function on a small
deterministic event loop and replays it against the recorded history:

* **Command events** (``ActivityScheduled``, ``MarkerRecorded``, ``TimerStarted``) are matched in
  order by a command cursor. The cursor steps over result events, signals and terminal events;
  a ``WorkflowCancelled`` is never consumed and stays in its way, so any dispatch after a cancel
  diverges against it. At the end of the history (the live frontier) a new command is emitted.
  Each event type declares which of these it is (``_core.events``); the replay itself, the
  cursor and the delivery, is ``_core.replay``, and this module keeps it warm (``Session``).
* **Result events** (``ActivityCompleted``/``Failed``, ``TimerFired``, ``SignalReceived``) are
  delivered one at a time, in history order, each time the workflow is quiescent. Live and
  replay therefore run the same algorithm over the same prefix, so they issue the same commands.
  A cooperative ``WorkflowCancelRequested`` is delivered the same way: ``ctx.is_cancelled()``
  turns true at its position, on every replay, cold or warm; no matcher ever meets it.
* A divergence raises ``NonDeterministic`` into the workflow and is recorded the moment it is
  raised (unless the run is sealed by a cancel), so catching it hides nothing.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core import failures
from harvest_celery._core.children import ContinueAsNew
from harvest_celery._core.commands import (
    Command,
    Completed,
    CompleteUpdate,
    ContinuedAsNew,
    Decision,
    Failed,
    Outcome,
    RecordMarker,
    ScheduleActivity,
    StartChildWorkflow,
)
from harvest_celery._core.context import WorkflowContext, WorkflowInfo
from harvest_celery._core.futures import Future
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._core.replay import Activation, EngineConfig, Replay, _Task
from harvest_celery._errors import CorruptHistory, HarvestError


def _outcome_of(future: Future, workflow_type: str) -> Outcome:
    try:
        return Completed(check_json(future.result(), f"result of workflow {workflow_type!r}"))
    except ContinueAsNew as link:
        return ContinuedAsNew(link.next_id, link.input, link.signals)
    except BaseException as exc:  # noqa: BLE001 - the workflow's own error is its outcome
        info = failures.describe(exc)
        return Failed(
            info.error_type,
            info.message,
            info.traceback,
            interrupt=isinstance(exc, (KeyboardInterrupt, SystemExit)),
        )


class Session:
    """A replay kept alive between decisions: the sticky cache that keeps decision cost flat in
    history length. ``advance`` feeds it only the events appended since its last decision; it
    refuses (returns None) unless they are exactly this session's own commands followed by
    results, so any other change (another worker decided, a cancel, a config change) falls back
    to a full replay, which is always correct."""

    def __init__(self, definition: WorkflowDefinition, activation: Activation, registry: Registry) -> None:
        self.replay = replay = Replay(definition, activation, registry)
        started = replay.events[0]
        assert isinstance(started, ev.WorkflowStarted)  # Replay checked it
        carried = started.carried or {}
        if not isinstance(carried, dict):
            raise CorruptHistory(f"WorkflowStarted.carried holds {type(carried).__name__}, not an object")
        scheduled = datetime.fromisoformat(started.scheduled_for) if started.scheduled_for else None
        info = WorkflowInfo(
            activation.execution_id,
            activation.workflow_type,
            replay.times[0],
            dict(carried),
            scheduled_for=scheduled,
            priority=started.priority,
        )
        self.main = _Task(replay, definition.fn(WorkflowContext(replay, info), started.input))
        replay.run_ready()
        self.decision = self._drive(range(1, len(replay.events)))

    @property
    def events(self) -> list[ev.Event]:
        return self.replay.events

    @property
    def reusable(self) -> bool:
        """Worth keeping: live, not diverged, not sealed by a cancel, not a probe."""
        d = self.decision
        return (
            d.nd is None and d.outcome is None and not self.replay.sealed and not self.replay.activation.probe
        )

    def _drive(self, indices: Any) -> Decision:
        replay = self.replay
        for index in indices:
            if self.main.future.done():
                break
            replay.deliver(index)
            replay.run_ready()
        done = self.main.future.done()
        outcome = _outcome_of(self.main.future, replay.definition.name) if done else None
        if replay.nd is None and not replay.sealed:
            # Recorded commands the code no longer issues are a divergence too (a removed step).
            leftover = [
                i for i in replay._rest(skip_signals=True) if isinstance(replay.events[i], ev.COMMAND_EVENTS)
            ]
            if leftover:
                replay.diverge("WorkflowCompleted" if done else "no further command", leftover[0])
        if replay.nd is not None:
            return Decision(nd=replay.nd.details())
        return Decision(commands=list(replay.commands), outcome=outcome)

    def advance(self, new: list[ev.HistoryEvent], config: EngineConfig) -> Decision | None:
        replay = self.replay
        if not self.reusable or config != replay.activation.config:
            return None
        ours = self.decision.commands
        if len(new) < len(ours) or (new and new[0].seq != len(replay.events)):
            return None
        for command, item in zip(ours, new, strict=False):
            if not _same(command, item.event):
                return None
        results = new[len(ours) :]
        if not all(isinstance(h.event, ev.ADVANCE_EVENTS) for h in results):  # declared: Event.advance
            return None
        # What this session emitted at the frontier is matched already: never a candidate.
        for item in new[: len(ours)]:
            replay.events.append(item.event)
            replay.times.append(item.recorded_at)
        indices = []
        for item in results:
            index = len(replay.events)
            replay.events.append(item.event)
            replay.times.append(item.recorded_at)
            if isinstance(item.event, ev.CANDIDATE_EVENTS):  # a held one: a signal
                replay.candidates.append(index)
            indices.append(index)
        replay.commands = []
        self.decision = self._drive(indices)
        return self.decision

    def catch_up(self, new: list[ev.HistoryEvent], config: EngineConfig) -> Decision | None:
        """``advance`` over a tail that may hold other processes' decisions too: it is cut
        after each run of results, so every piece is this session's commands (matched against
        what was recorded) followed by results, exactly what ``advance`` accepts. A tail it
        cannot take whole gives None (the session is then spent: close it and replay in full)."""
        at = 0
        while True:
            end = at + len(self.decision.commands)
            while end < len(new) and isinstance(new[end].event, ev.ADVANCE_EVENTS):
                end += 1
            if end > len(new) or (end == at and at < len(new)):
                return None  # recorded commands this session does not issue: not ours to take
            decision = self.advance(new[at:end], config)
            if decision is None or end == len(new):
                return decision
            at = end

    def committed(self, written: list[ev.HistoryEvent]) -> bool:
        """This session's last decision was written as ``written`` (its commands' events, in
        order, with their seqs and times): absorb them now, so the next ``advance`` needs only
        what came after. False (nothing absorbed) if they are not exactly its commands."""
        replay = self.replay
        ours = self.decision.commands
        if (
            len(written) != len(ours)
            or (written and written[0].seq != len(replay.events))
            or not all(_same(c, h.event) for c, h in zip(ours, written, strict=True))
        ):
            return False
        for item in written:
            replay.events.append(item.event)
            replay.times.append(item.recorded_at)
        self.decision = dataclasses.replace(self.decision, commands=[])
        return True

    def close(self) -> None:
        self.replay.close()


def _same(command: Command, event: ev.Event) -> bool:
    if isinstance(command, ScheduleActivity):
        return (
            isinstance(event, ev.ActivityScheduled)
            and event.activity_id == command.activity_id
            and event.activity_name == command.activity_name
            and event.call_convention == command.call_convention
            and event.node == command.node
        )
    if isinstance(command, RecordMarker):
        return isinstance(event, ev.MarkerRecorded) and event.name == command.name
    if isinstance(command, StartChildWorkflow):
        return isinstance(event, ev.ChildWorkflowScheduled) and event.child_id == command.child_id
    if isinstance(command, CompleteUpdate):
        return isinstance(event, ev.UpdateCompleted) and event.update_id == command.update_id
    return isinstance(event, ev.TimerStarted) and event.timer_id == command.timer_id


def decide(definition: WorkflowDefinition, activation: Activation, registry: Registry) -> Decision:
    """Replay ``activation.history`` through the workflow and return this decision."""
    session = Session(definition, activation, registry)
    session.close()
    return session.decision


def replay_history(
    definition: WorkflowDefinition,
    execution_id: str,
    history: list[ev.HistoryEvent],
    registry: Registry,
    config: EngineConfig | None = None,
) -> Decision:
    """Replay a recorded history as a probe (a pure read): raises nothing, returns the decision
    whose ``nd`` says whether the current code still matches the history."""
    started = history[0].event if history else None
    if not isinstance(started, ev.WorkflowStarted):
        raise CorruptHistory("a history starts with WorkflowStarted")
    activation = Activation(
        execution_id, started.workflow_type, history, config or EngineConfig(), probe=True
    )
    return decide(definition, activation, registry)


__all__ = [
    "Activation",
    "EngineConfig",
    "HarvestError",
    "Replay",
    "Session",
    "WorkflowInfo",
    "decide",
    "replay_history",
]
