"""Payload stores: large values live outside the event row, behind a reference.

A value whose encoded JSON is over the offload threshold is put in the registered store and
replaced in history by ``{"_harvest_offload_envelope": 1, "store_id": ..., "key": ...}``. The
interface is three calls, so an S3 bucket fits it as well as the two shipped (the file-system
store here; the Postgres one is SQL, so it lives in ``_store.blobs``).

A store that can also ``list`` its keys under a prefix (``ListablePayloadStore``, as both
shipped stores do) lets erasure and purge delete every blob under a run's prefix ``{run}/``,
an orphan a crash left between a blob and its statement included, and lets a completion be
written in one statement while the store offloads. ``PayloadStore`` itself stays three calls:
a Protocol cannot have an optional member, and stores written against it keep type-checking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

from harvest_celery._errors import PayloadStoreError

OFFLOAD_KEY = "_harvest_offload_envelope"


class PayloadStore(Protocol):
    store_id: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


class ListablePayloadStore(PayloadStore, Protocol):
    """A payload store that can list its keys: every key starting with ``prefix``."""

    def list(self, prefix: str) -> list[str]: ...


def listable(store: Any) -> bool:
    """Does ``store`` list its keys (``ListablePayloadStore``)?"""
    return callable(getattr(store, "list", None))


def run_prefix(execution_id: str) -> str:
    """The prefix of every blob key of a run (run ids hold no ``/``)."""
    return f"{execution_id}/"


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
    """Blobs as files under ``root`` (a shared volume for multi-host deployments).

    A key's file name is the key percent-encoded (``a/1/output`` is ``a%2F1%2Foutput``), so
    ``list`` reads every key back exactly. Files written by earlier versions (``/`` as ``__``)
    are still read and deleted; ``list`` reads their names back with ``__`` as ``/``."""

    def __init__(self, root: str | Path, store_id: str = "fs") -> None:
        self.root = Path(root)
        self.store_id = store_id

    def _check(self, key: str, name: str) -> Path:
        if ".." in name or name.startswith("."):
            raise PayloadStoreError(f"invalid blob key {key!r}", key=key, store_id=self.store_id)
        return self.root / name

    def _path(self, key: str) -> Path:
        return self._check(key, quote(key, safe=""))

    def _legacy(self, key: str) -> Path:
        return self._check(key, key.replace("/", "__"))

    def put(self, key: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._path(key).with_name(self._path(key).name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(self._path(key))

    def get(self, key: str) -> bytes:
        for path in (self._path(key), self._legacy(key)):
            try:
                return path.read_bytes()
            except FileNotFoundError:
                continue
        raise PayloadStoreError(
            f"blob {key!r} is missing from payload store {self.store_id!r}", key=key, store_id=self.store_id
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
        self._legacy(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for path in self.root.iterdir():
            name = path.name
            if name.endswith(".tmp"):
                continue
            key = unquote(name) if "%" in name else name.replace("__", "/")
            if key.startswith(prefix):
                keys.append(key)
        return sorted(keys)
