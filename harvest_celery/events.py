"""The event types of a run's history (``Harvest.history`` returns them inside ``HistoryEvent``)."""

from harvest_celery._core.events import (
    ActivityCompleted,
    ActivityFailed,
    ActivityScheduled,
    ActivityStarted,
    Event,
    HistoryEvent,
    MarkerRecorded,
    SignalReceived,
    TimerFired,
    TimerStarted,
    WorkflowCancelled,
    WorkflowCancelRequested,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowStarted,
    WorkflowTimeoutRequested,
)

__all__ = [
    "ActivityCompleted",
    "ActivityFailed",
    "ActivityScheduled",
    "ActivityStarted",
    "Event",
    "HistoryEvent",
    "MarkerRecorded",
    "SignalReceived",
    "TimerFired",
    "TimerStarted",
    "WorkflowCancelled",
    "WorkflowCancelRequested",
    "WorkflowCompleted",
    "WorkflowFailed",
    "WorkflowStarted",
    "WorkflowTimeoutRequested",
]
