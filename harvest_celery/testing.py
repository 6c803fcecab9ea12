"""An in-memory world for testing workflows with no database, broker or worker.

``Simulator`` drives the same pure engine the workers use, applying each decision to an
in-memory history with the same rules (``_lifecycle``). Activities are executed by calling their
Python functions, or completed/failed by hand to build any history shape::

    sim = Simulator(checkout, charge_payment, refund_payment)
    run = sim.start("checkout", {"order_id": 7})
    run.run_to_end()
    assert run.status == "COMPLETED"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.commands import Decision
from harvest_celery._core.engine import Activation, EngineConfig, Session, replay_history
from harvest_celery._core.lifecycle import (
    CANCELLED,
    RUNNING,
    TERMINAL_STATUSES,
    cancel_requested,
    decision_events,
    open_activity_ids,
    status_after_cancel,
    status_for_outcome,
    timeout_requested,
)
from harvest_celery._core.queries import answer, query_arg
from harvest_celery._core.registry import Registry, register_into
from harvest_celery._core.validators import update_arg, validate


def registry_of(*objects: Any) -> Registry:
    """A registry holding the decorated workflows, activities and DAGs given."""
    registry = Registry()
    register_into(registry, objects)
    return registry


@dataclass
class SimRun:
    sim: Simulator
    execution_id: str
    workflow_type: str
    history: list[ev.HistoryEvent] = field(default_factory=list)
    status: str = RUNNING
    nd: dict[str, Any] | None = None
    metrics: list[str] = field(default_factory=list)
    # activity ids whose task row a cancel failed (they never run)
    cancelled_rows: set[str] = field(default_factory=set)
    session: Session | None = None  # the warm replay when the simulator is sticky

    @property
    def events(self) -> list[ev.Event]:
        return [h.event for h in self.history]

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def append(self, event: ev.Event) -> None:
        self.history.append(ev.HistoryEvent(len(self.history), event, self.sim.tick()))

    # ── decisions ────────────────────────────────────────────────────────────────────────────
    def decide(self) -> Decision:
        """One decision, applied like the store applies it."""
        definition = self.sim.registry.workflow(self.workflow_type)
        decision = None
        session, self.session = self.session, None
        if session is not None:  # the sticky path, exactly as the runtime takes it
            decision = session.advance(self.history[len(session.events) :], self.sim.config)
        if session is None or decision is None:
            activation = Activation(
                self.execution_id, self.workflow_type, list(self.history), self.sim.config
            )
            session = Session(definition, activation, self.sim.registry)
            decision = session.decision
        if self.sim.sticky and session.reusable:
            self.session = session
        else:
            session.close()
        if decision.nd is not None:
            if self.status == RUNNING:
                self.nd = decision.nd  # nd-blocked: nothing appended, still RUNNING
            return decision
        self.nd = None
        for event in decision_events(decision, self.events):
            self.append(event)
        self.metrics.extend(decision.metrics)
        self.status = status_for_outcome(
            decision, self.status, cancel_requested(self.events), timeout_requested(self.events) is not None
        )
        return decision

    def replay(self) -> Decision:
        """A probe replay of the current history (records and counts nothing)."""
        definition = self.sim.registry.workflow(self.workflow_type)
        return replay_history(
            definition, self.execution_id, list(self.history), self.sim.registry, self.sim.config
        )

    def query(self, name: str, arg: Any = None) -> Any:
        """As ``Harvest.query``: the answer of the run's query handler ``name`` on a replay of
        the current history built for this call (the warm session, if any, is not touched)."""
        definition = self.sim.registry.workflow(self.workflow_type)
        activation = Activation(
            self.execution_id, self.workflow_type, list(self.history), self.sim.config, probe=True
        )
        return answer(definition, activation, self.sim.registry, name, query_arg(name, arg))

    def update(self, name: str, arg: Any = None, update_id: str | None = None) -> str:
        """As ``Harvest.update``'s acceptance: validate on a replay built for the call, then
        append ``UpdateAccepted`` (an id already accepted appends nothing). Returns the id;
        ``update_outcome`` reads its ``UpdateCompleted`` once a decision recorded it."""
        update_id = update_id or f"u{len(self.history)}"
        if any(isinstance(e, ev.UpdateAccepted) and e.update_id == update_id for e in self.events):
            return update_id
        payload = update_arg(name, arg)
        definition = self.sim.registry.workflow(self.workflow_type)
        activation = Activation(
            self.execution_id, self.workflow_type, list(self.history), self.sim.config, probe=True
        )
        validate(definition, activation, self.sim.registry, name, payload)
        self.append(ev.UpdateAccepted(update_id, name, payload))
        return update_id

    def update_outcome(self, update_id: str) -> ev.UpdateCompleted | None:
        """The recorded ``UpdateCompleted`` of ``update_id``, if any."""
        done = [e for e in self.events if isinstance(e, ev.UpdateCompleted) and e.update_id == update_id]
        return done[0] if done else None

    # ── the world ────────────────────────────────────────────────────────────────────────────
    def open_activities(self) -> list[ev.ActivityScheduled]:
        ids = set(open_activity_ids(self.events)) - self.cancelled_rows
        return [e for e in self.events if isinstance(e, ev.ActivityScheduled) and e.activity_id in ids]

    def scheduled(self) -> list[ev.ActivityScheduled]:
        return [e for e in self.events if isinstance(e, ev.ActivityScheduled)]

    def start_activity(self, activity_id: str, attempt: int = 1) -> None:
        self.append(ev.ActivityStarted(activity_id, attempt, "sim"))

    def complete(self, activity_id: str, output: Any = None, *, started: bool = True) -> None:
        if started:
            self.start_activity(activity_id)
        self.append(ev.ActivityCompleted(activity_id, output))

    def fail(
        self,
        activity_id: str,
        error_type: str = "RuntimeError",
        message: str = "boom",
        *,
        started: bool = True,
    ) -> None:
        if started:
            self.start_activity(activity_id)
        self.append(ev.ActivityFailed(activity_id, error_type, message))

    def signal(self, name: str, payload: Any = None) -> None:
        self.append(ev.SignalReceived(name, payload))

    def fire_timers(self) -> None:
        fired = {e.timer_id for e in self.events if isinstance(e, ev.TimerFired)}
        for e in self.events:
            if isinstance(e, ev.TimerStarted) and e.timer_id not in fired:
                self.append(ev.TimerFired(e.timer_id))

    def cancel(self, reason: str = "", *, timed_out: bool = False) -> None:
        """As ``cancel_workflow_execution``: seal, fail unstarted rows, then the post-cancel
        decision. ``timed_out``: as the seal at the end of a timeout's grace period (TIMED_OUT)."""
        if self.status in TERMINAL_STATUSES:
            raise RuntimeError(f"cannot cancel a {self.status} run")
        self.append(ev.WorkflowCancelled(reason))
        self.status = status_after_cancel(self.events, timed_out)
        started = {e.activity_id for e in self.events if isinstance(e, ev.ActivityStarted)}
        self.cancelled_rows |= {a for a in open_activity_ids(self.events) if a not in started}
        self.decide()

    def request_cancellation(self, reason: str = "") -> bool:
        """As ``Harvest.request_cancellation``: record ``WorkflowCancelRequested`` (the run stays
        RUNNING, shown CANCELLING); False if a request is already open. Like ``signal``, it does
        not decide: call ``decide()`` (or ``run_to_end()``)."""
        if self.status != RUNNING:
            raise RuntimeError(f"cannot request the cancellation of a {self.status} run")
        if cancel_requested(self.events):
            return False
        self.append(ev.WorkflowCancelRequested(reason))
        return True

    def time_out(self, timeout: str = "execution", reason: str = "") -> None:
        """As the sweeper at an expired deadline: record ``WorkflowTimeoutRequested`` (the run
        stays RUNNING, shown CANCELLING). Like ``signal``, it does not decide."""
        if self.status != RUNNING:
            raise RuntimeError(f"cannot time out a {self.status} run")
        self.append(ev.WorkflowTimeoutRequested(timeout, reason or f"{timeout}_timeout expired"))

    @property
    def cancelling(self) -> bool:
        """RUNNING with an open cancellation request (the derived CANCELLING status)."""
        return self.status == RUNNING and cancel_requested(self.events)

    def execute(self, activity: ev.ActivityScheduled) -> None:
        """Run one open activity by calling its function (exceptions become ActivityFailed)."""
        override = self.sim.behaviour.get(activity.activity_name)
        fn: Callable[[Any], Any] | None = override or self.sim.registry.activity(activity.activity_name).fn
        self.start_activity(activity.activity_id)
        try:
            assert fn is not None
            output = fn(activity.input)
        except Exception as exc:  # noqa: BLE001 - becomes the activity's failure
            self.append(ev.ActivityFailed(activity.activity_id, type(exc).__name__, str(exc)))
        else:
            self.append(ev.ActivityCompleted(activity.activity_id, output))

    def run_to_end(self, max_cycles: int = 1000) -> SimRun:
        """Decide, execute every open activity (in dispatch order), fire timers; until the run
        finishes or nothing moves."""
        for _ in range(max_cycles):
            before = len(self.history)
            self.decide()
            if self.nd is not None or self.status not in (RUNNING, CANCELLED) and not self.open_activities():
                return self
            for activity in self.open_activities():
                if activity.activity_id not in self.cancelled_rows and not self._started(
                    activity.activity_id
                ):
                    self.execute(activity)
            self.fire_timers()
            if len(self.history) == before:
                return self
        raise RuntimeError("simulation did not settle")

    def _started(self, activity_id: str) -> bool:
        return any(isinstance(e, ev.ActivityStarted) and e.activity_id == activity_id for e in self.events)


class Simulator:
    """Holds a registry and a fake clock; starts ``SimRun``s."""

    def __init__(self, *objects: Any, config: EngineConfig | None = None, sticky: bool = False) -> None:
        self.registry = registry_of(*objects)
        # sticky: keep each run's replay warm between decisions, as the worker runtime does
        self.sticky = sticky
        self.config = config or EngineConfig()
        self.clock = datetime(2026, 1, 1, tzinfo=timezone.utc)
        # activity name → function overriding the registered one (to inject failures)
        self.behaviour: dict[str, Callable[[Any], Any]] = {}

    def tick(self) -> datetime:
        self.clock += timedelta(milliseconds=1)
        return self.clock

    def start(self, workflow_type: str, input: Any = None, execution_id: str = "run-1") -> SimRun:
        self.registry.workflow(workflow_type)
        run = SimRun(self, execution_id, workflow_type)
        run.append(ev.WorkflowStarted(workflow_type, input))
        return run

    def run_from_history(
        self, workflow_type: str, events: list[ev.Event], execution_id: str = "run-1"
    ) -> SimRun:
        """A run whose history is given verbatim (e.g. one recorded by an older build)."""
        run = SimRun(self, execution_id, workflow_type)
        for event in events:
            run.append(event)
        if any(isinstance(e, ev.WorkflowCancelled) for e in events):
            run.status = status_after_cancel(events)
        return run
