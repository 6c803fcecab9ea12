"""Payload erasure rules (pure; the store applies them under the run-row lock in
``_store.runs.erase``): every payload field becomes a tombstone, error messages are scrubbed
(exception text often quotes the input) keeping the error type, events are never removed or
reordered, and offloaded blobs are collected for deletion once the tombstones commit."""

from __future__ import annotations

from typing import Any

from harvest_celery._payloads.fields import PAYLOAD_FIELDS, SCRUBBED_FIELDS
from harvest_celery._payloads.stores import OFFLOAD_KEY

ERASED: dict[str, Any] = {"_harvest_erased": True}
ERASED_TEXT = "[erased]"

BlobRef = tuple[str, str]  # (store_id, key)


def is_erased(value: Any) -> bool:
    return isinstance(value, dict) and value.get("_harvest_erased") is True


def references(value: Any) -> list[BlobRef]:
    """The blob a value was offloaded to, if it was."""
    if isinstance(value, dict) and value.get(OFFLOAD_KEY) == 1:
        return [(str(value.get("store_id")), str(value.get("key")))]
    return []


def erase_event(data: dict[str, Any]) -> tuple[dict[str, Any], list[BlobRef], int]:
    """An event's stored data with every payload field tombstoned and a failure's message
    scrubbed: (new data, blobs to delete, fields erased). Idempotent."""
    changed = dict(data)
    refs: list[BlobRef] = []
    fields = 0
    for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()):
        value = data.get(name)
        if value is not None and not is_erased(value):
            refs += references(value)
            changed[name] = ERASED
            fields += 1
    for name in SCRUBBED_FIELDS.get(data.get("type", ""), ()):
        if data.get(name) != ERASED_TEXT:
            changed[name] = ERASED_TEXT
    return changed, refs, fields


def erase_error(error: Any) -> Any:
    """A run's recorded error with its message scrubbed (the type stays)."""
    if isinstance(error, dict) and error.get("message") not in (None, ERASED_TEXT):
        return {**error, "message": ERASED_TEXT}
    return error
