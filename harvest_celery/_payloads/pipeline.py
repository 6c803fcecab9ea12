"""Payload checks at the edges: every value that enters history must be plain JSON."""

from __future__ import annotations

import json
import math
from typing import Any

from harvest_celery._errors import PayloadNotSerializable, PayloadTooLarge


def _reject_nan(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{value!r} is not valid JSON")
    return value


def encoded_size(value: Any, what: str) -> int:
    """Bytes of ``value`` as compact JSON; raises ``PayloadNotSerializable`` naming ``what``."""
    return len(dumps(value, what).encode("utf-8"))


def dumps(value: Any, what: str) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise PayloadNotSerializable(what, str(exc)) from None
    return text


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` as it will read back from history (tuples become lists), or raise."""
    text = dumps(value, what)
    if "\\u0000" in text or "\\ud" in text:  # cheap gate before the full walk
        check_storable(value, what)
    return json.loads(text)


def storable_text(text: str) -> bool:
    # Postgres text and jsonb cannot hold NUL, and a lone surrogate cannot be encoded as UTF-8.
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_storable(value: Any, what: str) -> Any:
    """Every string in ``value`` (keys included) can be stored by Postgres; else
    ``PayloadNotSerializable``, before anything is written."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not storable_text(item):
                raise PayloadNotSerializable(what, "a string holds a NUL character or a lone "
                                                   "surrogate, which cannot be stored")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def check_cap(value: Any, what: str, cap: int | None) -> None:
    """Raise ``PayloadTooLarge`` if ``value`` is over ``cap`` bytes (``None`` = no cap)."""
    if cap is None:
        return
    size = encoded_size(value, what)
    if size > cap:
        raise PayloadTooLarge(what, size, cap)


# ── payload-bearing fields: the one definition every encode/decode/erase pass uses ─────────────
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "WorkflowStarted": ("input", "carried"),
    "ActivityScheduled": ("input",),
    "ActivityCompleted": ("output",),
    "MarkerRecorded": ("details",),
    "SignalReceived": ("payload",),
    "WorkflowCompleted": ("result",),
}
EXECUTION_PAYLOAD_COLUMNS = ("input", "result")
ERASED: dict[str, Any] = {"_harvest_erased": True}


def is_erased(value: Any) -> bool:
    return isinstance(value, dict) and value.get("_harvest_erased") is True


class Payloads:
    """The codec chain plus the optional payload store, applied to payload-bearing fields.

    Encode: codec first, then offload when the encoded value is over ``offload_threshold``.
    Decode: inflate a reference, then undo the codec.
    """

    def __init__(self, codec: Any = None, store: Any = None, offload_threshold: int | None = None) -> None:
        from harvest_celery._payloads.codec import CodecChain

        self.codec = codec if isinstance(codec, CodecChain) else CodecChain([codec] if codec else [])
        self.store = store
        self.offload_threshold = offload_threshold if store is not None else None

    def encode_value(self, value: Any, key: str) -> Any:
        if value is None or is_erased(value):
            return value
        encoded = self.codec.encode(value)
        if self.offload_threshold is not None:
            text = dumps(encoded, key)
            if len(text.encode()) > self.offload_threshold:
                from harvest_celery._payloads.stores import OFFLOAD_KEY

                self.store.put(key, text.encode())
                return {OFFLOAD_KEY: 1, "store_id": self.store.store_id, "key": key}
        return encoded

    def decode_value(self, value: Any) -> Any:
        from harvest_celery._payloads.stores import PayloadStoreError, is_reference

        if is_reference(value):
            key, store_id = str(value.get("key")), str(value.get("store_id"))
            if self.store is None:
                raise PayloadStoreError(
                    f"payload is offloaded to store {store_id!r} (blob {key!r}) but no payload store "
                    "is configured: restore the store configuration to read it",
                    key=key, store_id=store_id)
            if store_id != self.store.store_id:
                raise PayloadStoreError(
                    f"payload reference names store {store_id!r} (blob {key!r}); the configured "
                    f"store is {self.store.store_id!r}", key=key, store_id=store_id)
            value = json.loads(self.store.get(key))
        return self.codec.decode(value)

    def encode_event(self, data: dict[str, Any], key_prefix: str) -> dict[str, Any]:
        fields = PAYLOAD_FIELDS.get(data.get("type", ""), ())
        if not fields or not (self.codec or self.offload_threshold is not None):
            return data
        out = dict(data)
        for name in fields:
            out[name] = self.encode_value(out.get(name), f"{key_prefix}/{name}")
        return out

    def decode_event(self, data: dict[str, Any]) -> dict[str, Any]:
        if not needs_decode(data):
            return data
        out = dict(data)
        for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()):
            out[name] = self.decode_value(out.get(name))
        return out


def _opaque(value: Any) -> bool:
    return isinstance(value, dict) and ("_harvest_codec" in value or "_harvest_offload_envelope" in value)


def needs_decode(data: dict[str, Any]) -> bool:
    """The cheap structural scan: is any payload field of this event opaque?"""
    return any(_opaque(data.get(name)) for name in PAYLOAD_FIELDS.get(data.get("type", ""), ()))


def references(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict) and value.get("_harvest_offload_envelope") == 1:
        return [(str(value.get("store_id")), str(value.get("key")))]
    return []
