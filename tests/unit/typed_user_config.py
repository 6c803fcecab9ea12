"""A user's own codec and payload store, written as plain classes that match the Protocols
(``harvest_celery.Codec``, ``harvest_celery.PayloadStore``) without inheriting from them, given to
``Harvest(...)``. mypy checks this module (pyproject's ``[tool.mypy] files``), and
test_typed_user_config.py runs it."""

from __future__ import annotations

import base64
import json
from typing import Any

from harvest_celery import FileSystemPayloadStore, Harvest, PostgresPayloadStore, Timings


class Base64Codec:
    codec_id = "b64"

    def encode(self, value: Any) -> dict[str, Any]:
        return {
            "_harvest_codec": self.codec_id,
            "data": base64.b64encode(json.dumps(value).encode()).decode(),
        }

    def decode(self, envelope: dict[str, Any]) -> Any:
        return json.loads(base64.b64decode(envelope["data"]))


class MemoryStore:
    store_id = "memory"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data

    def get(self, key: str) -> bytes:
        return self.blobs[key]

    def delete(self, key: str) -> None:
        self.blobs.pop(key, None)


def make(database_url: str, store: MemoryStore) -> Harvest:
    return Harvest(
        database_url,
        codec=Base64Codec(),
        payload_store=store,
        offload_threshold=64,
        timings=Timings(redispatch_after=5.0),
        celery_error_detail="type",
        pool_size=2,
    )


def the_shipped_ones(database_url: str, root: str) -> list[Harvest]:
    return [
        Harvest(database_url, payload_store=PostgresPayloadStore()),
        Harvest(database_url, payload_store=FileSystemPayloadStore(root)),
    ]
