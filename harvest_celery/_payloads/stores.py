"""Payload stores: large values live outside the event row, behind a reference.

A value whose encoded JSON is over the offload threshold is put in the registered store and
replaced in history by ``{"_harvest_offload_envelope": 1, "store_id": ..., "key": ...}``. The
interface is three calls, so an S3 bucket fits it as well as the two shipped (the file-system
store here; the Postgres one is SQL, so it lives in ``_store.blobs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from harvest_celery._errors import PayloadStoreError

OFFLOAD_KEY = "_harvest_offload_envelope"



class PayloadStore(Protocol):
    store_id: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


class DeferredPuts:
    """A store that records ``put`` instead of writing, for a start whose run row may turn out
    to exist already: the blobs are written (``puts``) only once the row is known to be new, so
    a conflicting start never overwrites another run's blob. Reads and deletes go to ``store``."""

    def __init__(self, store: PayloadStore) -> None:
        self.store = store
        self.store_id = store.store_id
        self.puts: list[tuple[str, bytes]] = []

    def put(self, key: str, data: bytes) -> None:
        self.puts.append((key, data))

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def delete(self, key: str) -> None:
        self.store.delete(key)


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and value.get(OFFLOAD_KEY) == 1


class FileSystemPayloadStore:
    """Blobs as files under ``root`` (a shared volume for multi-host deployments)."""

    def __init__(self, root: str | Path, store_id: str = "fs") -> None:
        self.root = Path(root)
        self.store_id = store_id

    def _path(self, key: str) -> Path:
        safe = key.replace("/", "__")
        if ".." in safe or safe.startswith("."):
            raise PayloadStoreError(f"invalid blob key {key!r}", key=key, store_id=self.store_id)
        return self.root / safe

    def put(self, key: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(self._path(key))

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise PayloadStoreError(f"blob {key!r} is missing from payload store {self.store_id!r}",
                                    key=key, store_id=self.store_id) from None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
