"""Payload stores: large values live outside the event row, behind a reference.

A value whose encoded JSON is over the offload threshold is put in the registered store and
replaced in history by ``{"_harvest_offload_envelope": 1, "store_id": ..., "key": ...}``. The
interface is three calls, so an S3 bucket fits it as well as the two shipped here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from harvest_celery._errors import HarvestError
from harvest_celery._store.schema import blobs

OFFLOAD_KEY = "_harvest_offload_envelope"


class PayloadStoreError(HarvestError):
    """A reference cannot be inflated (foreign store, missing blob, no store configured)."""

    def __init__(self, message: str, *, key: str = "", store_id: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.store_id = store_id


class PayloadStore(Protocol):
    store_id: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and value.get(OFFLOAD_KEY) == 1


class PostgresPayloadStore:
    """Blobs in the ``harvest_blobs`` table of a database (by default the engine's own)."""

    def __init__(self, database_url: str | None = None, store_id: str = "pg") -> None:
        self.store_id = store_id
        self._url = database_url
        self._engine: sa.Engine | None = None
        self._pid = -1

    def bind(self, database_url: str) -> None:
        if self._url is None:
            self._url = database_url

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None or self._pid != os.getpid():
            assert self._url is not None, "PostgresPayloadStore needs a database url"
            self._engine = sa.create_engine(self._url, pool_pre_ping=True)
            self._pid = os.getpid()
        return self._engine

    def put(self, key: str, data: bytes) -> None:
        with self.engine.begin() as conn:
            conn.execute(blobs.delete().where(blobs.c.key == key))
            conn.execute(blobs.insert().values(key=key, store_id=self.store_id, data=data))

    def get(self, key: str) -> bytes:
        with self.engine.connect() as conn:
            data = conn.execute(sa.select(blobs.c.data).where(blobs.c.key == key)).scalar()
        if data is None:
            raise PayloadStoreError(f"blob {key!r} is missing from payload store {self.store_id!r}",
                                    key=key, store_id=self.store_id)
        return bytes(data)

    def delete(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(blobs.delete().where(blobs.c.key == key))


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
