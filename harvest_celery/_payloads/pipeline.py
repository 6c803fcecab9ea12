"""The payload pipeline: codec chain and payload store applied to the payload-bearing fields of
events and run rows, and the one definition of those fields (erasure reads it too)."""

from __future__ import annotations

import json
from typing import Any

from harvest_celery._core.jsonvalues import dumps
from harvest_celery._errors import HarvestError, PayloadCodecError, PayloadStoreError
from harvest_celery._payloads.codec import CodecChain
from harvest_celery._payloads.erasure import is_erased
from harvest_celery._payloads.fields import PAYLOAD_FIELDS
from harvest_celery._payloads.stores import OFFLOAD_KEY, is_reference


class Payloads:
    """The codec chain plus the optional payload store, applied to payload-bearing fields.

    Encode: codec first, then offload when the encoded value is over ``offload_threshold``.
    Decode: inflate a reference, then undo the codec. Whatever a store or codec raises on the way
    (an ``OSError`` of a file system, a client's own exception) comes out as a
    ``PayloadStoreError`` / ``PayloadCodecError``: read-only views degrade on it, the retry guard
    fails closed with it (503).
    """

    def __init__(self, codec: Any = None, store: Any = None, offload_threshold: int | None = None) -> None:
        self.codec = codec if isinstance(codec, CodecChain) else CodecChain([codec] if codec else [])
        self.store = store
        self.offload_threshold = offload_threshold if store is not None else None

    def with_store(self, store: Any) -> Payloads:
        """The same codec chain and offload threshold over another store (the blobs of a start
        written on the application's own connection, or recorded to be written after)."""
        out = Payloads(self.codec, store, self.offload_threshold)
        out.offload_threshold = self.offload_threshold
        return out

    def encode_value(self, value: Any, key: str) -> Any:
        if value is None or is_erased(value):
            return value
        encoded = self.codec.encode(value)
        if self.offload_threshold is not None:
            data = dumps(encoded, key).encode()
            if len(data) > self.offload_threshold:
                self.store.put(key, data)
                return {OFFLOAD_KEY: 1, "store_id": self.store.store_id, "key": key}
        return encoded

    def offloads(self, value: Any) -> bool:
        """Would ``encode_value`` put ``value`` in the store (its encoded JSON is over
        ``offload_threshold``), leaving only a reference inline? The engine's activity-input cap
        asks (``EngineConfig.offloads``); nothing is written. Always False without a store."""
        if self.offload_threshold is None or value is None or is_erased(value):
            return False
        encoded = self.codec.encode(value) if self.codec else value
        return len(dumps(encoded, "payload").encode()) > self.offload_threshold

    def decode_value(self, value: Any) -> Any:
        if is_reference(value):
            key, store_id = str(value.get("key")), str(value.get("store_id"))
            if self.store is None:
                raise PayloadStoreError(
                    f"payload is offloaded to store {store_id!r} (blob {key!r}) but no payload store "
                    "is configured: restore the store configuration to read it",
                    key=key,
                    store_id=store_id,
                )
            if store_id != self.store.store_id:
                raise PayloadStoreError(
                    f"payload reference names store {store_id!r} (blob {key!r}); the configured "
                    f"store is {self.store.store_id!r}",
                    key=key,
                    store_id=store_id,
                )
            try:
                value = json.loads(self.store.get(key))
            except HarvestError:
                raise
            except Exception as exc:  # noqa: BLE001 - any store or parse failure, one error type
                raise PayloadStoreError(
                    f"blob {key!r} of payload store {store_id!r} cannot be read: {type(exc).__name__}: {exc}",
                    key=key,
                    store_id=store_id,
                ) from exc
        try:
            return self.codec.decode(value)
        except HarvestError:
            raise
        except Exception as exc:  # noqa: BLE001 - a codec's own failure, one error type
            raise PayloadCodecError(f"payload cannot be decoded: {type(exc).__name__}: {exc}") from exc

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
