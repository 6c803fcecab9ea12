"""The payload-bearing fields: the one definition every encode, decode and erase pass uses."""

from __future__ import annotations

# event type -> its fields that hold user payloads
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "WorkflowStarted": ("input", "carried"),
    "ActivityScheduled": ("input",),
    "ActivityCompleted": ("output",),
    "MarkerRecorded": ("details",),
    "SignalReceived": ("payload",),
    "WorkflowCompleted": ("result",),
}
# execution-row columns that hold user payloads
EXECUTION_PAYLOAD_COLUMNS = ("input", "result")
