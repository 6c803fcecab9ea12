"""What every part of ``Harvest`` shares: its store, registry and runtime, and the after-commit
step. The client is split by role (``_client`` commands, ``_client_ops`` operator actions,
``_client_reads`` reads), each a class that ``Harvest`` combines."""

from __future__ import annotations

from typing import Any

from harvest_celery._core.registry import Registry
from harvest_celery._errors import InvalidState
from harvest_celery._runtime.consumers import QueueConsumers
from harvest_celery._runtime.inline import InlineDispatcher
from harvest_celery._runtime.runtime import Runtime
from harvest_celery._store.store import Store


class ClientBase:
    """The state ``Harvest.__init__`` sets, declared once for the role classes."""

    database_url: str
    store: Store
    registry: Registry
    runtime: Runtime
    celery_app: Any
    _inline: InlineDispatcher | None
    _consumers: QueueConsumers | None  # asked by stuck() only, never the hot path

    @property
    def embedded(self) -> bool:
        return self._inline is not None

    def _after(self, tx: Any) -> None:
        self.runtime._after_commit(tx)
        if self._inline is not None:
            self.drain()

    # ── embedded mode ────────────────────────────────────────────────────────────────────────
    def drain(self) -> None:
        """Embedded mode: run every queued decision and activity in this process."""
        inline = self._inline
        if inline is None:
            raise InvalidState("-", "not embedded", "drain")
        inline.drain(self.runtime, self.registry)
