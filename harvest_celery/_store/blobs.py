"""The Postgres payload store: offloaded blobs in the ``blobs`` table (it is SQL, so it lives in
the store layer; the protocol and the file-system store live in ``_payloads.stores``)."""

from __future__ import annotations

import os
from typing import Any

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
        self._pool: dict[str, Any] = {"pool_size": 1, "max_overflow": 4}  # until bound to a Harvest's

    def bind(self, database_url: str, pools: Any = None) -> None:
        """Bound by ``Store``: the harvest database's URL when none was given, and the size of a
        pool of its own from the store's pool settings (``claim_pool_size`` + ``claim_max_overflow``:
        blobs are read and written far less often than transactions), and its ``pooled`` flag."""
        if self._url is None:
            self._url = database_url
        if pools is not None:
            self._pool = {"pool_size": pools.claim_size, "max_overflow": pools.claim_overflow}
            if pools.pooled and sa.engine.make_url(self._url).get_driver_name() == "psycopg":
                self._pool["connect_args"] = {"prepare_threshold": None}

    def lives_in(self, database_url: str) -> bool:
        """Its blobs are in that database (the harvest database, by default)."""
        return self._url is None or self._url == database_url

    def on_connection(self, conn: Any) -> ConnectionBlobs:
        """This store with its writes made on ``conn``, inside that connection's transaction."""
        return ConnectionBlobs(self, conn)

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None or self._pid != os.getpid():
            assert self._url is not None, "PostgresPayloadStore needs a database url"
            self._engine = sa.create_engine(self._url, pool_pre_ping=True, **self._pool)
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
            raise PayloadStoreError(
                f"blob {key!r} is missing from payload store {self.store_id!r}",
                key=key,
                store_id=self.store_id,
            )
        return bytes(data)

    def delete(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(blobs.delete().where(blobs.c.key == key))

    def list(self, prefix: str) -> list[str]:
        """Every key of this store starting with ``prefix`` (``ListablePayloadStore``)."""
        q = (
            sa.select(blobs.c.key)
            .where(blobs.c.key.startswith(prefix, autoescape=True) & (blobs.c.store_id == self.store_id))
            .order_by(blobs.c.key)
        )
        with self.engine.connect() as conn:
            return [str(key) for key in conn.execute(q).scalars()]


class ConnectionBlobs:
    """The Postgres payload store writing on a given SQLAlchemy connection — an application's,
    inside its transaction — so a start that rolls back leaves no blob behind. Reads and deletes
    go to the store's own engine."""

    def __init__(self, store: PostgresPayloadStore, conn: Any) -> None:
        self.store = store
        self.store_id = store.store_id
        self.conn = conn

    def put(self, key: str, data: bytes) -> None:
        self.conn.execute(blobs.delete().where(blobs.c.key == key))
        self.conn.execute(blobs.insert().values(key=key, store_id=self.store_id, data=data))

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def delete(self, key: str) -> None:
        self.store.delete(key)
