"""The payload-bearing fields: the one definition every encode, decode and erase pass uses.

Derived from the event classes' own field declarations (``metadata=PAYLOAD`` / ``SCRUBBED`` in
``_core.events``), keyed by the stored type name, as the passes read stored JSON.
"""

from __future__ import annotations

from harvest_celery._core.events import EVENT_TYPES, payload_fields, scrubbed_fields

# event type -> its fields that hold user payloads (types with none are absent)
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    name: fields for name, cls in EVENT_TYPES.items() if (fields := payload_fields(cls))
}
# event type -> its free-text fields erasure replaces by ``[erased]`` (a failure's message)
SCRUBBED_FIELDS: dict[str, tuple[str, ...]] = {
    name: fields for name, cls in EVENT_TYPES.items() if (fields := scrubbed_fields(cls))
}
# execution-row columns that hold user payloads: a workflow's admission key (a customer id) too
EXECUTION_PAYLOAD_COLUMNS = ("input", "result", "limit_key")
# activity-task-row columns that hold user payloads: an activity's limit key (a merchant id)
TASK_PAYLOAD_COLUMNS = ("limit_key",)
