"""The Postgres payload store: offloaded blobs in the ``blobs`` table (it is SQL, so it lives in
the store layer; the protocol and the file-system store live in ``_payloads.stores``)."""

from __future__ import annotations

import os

import sqlalchemy as sa

from harvest_celery._errors import PayloadStoreError
from harvest_celery._store.schema import blobs


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
