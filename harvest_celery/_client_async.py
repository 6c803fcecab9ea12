"""``AsyncHarvest``: the client for asyncio apps (FastAPI, Starlette, Quart, any ASGI app).

Every call is the ``Harvest`` call of the same name, run in a thread so the event loop never
blocks on Postgres or the broker: short calls (start, signal, cancel, reads) in one small pool,
``result`` waits in another, so a hundred requests waiting on runs never starve a start. A
waiting ``result`` holds a thread for at most ``wait_slice`` seconds at a time, asleep on the
process's one ``LISTEN`` connection (``_store.listener``), and is cancellable between slices.

A start may join an async SQLAlchemy transaction: pass an ``AsyncSession`` or
``AsyncConnection`` as ``connection`` and the start is written through its ``run_sync`` on that
transaction (Postgres, the harvest database), exactly as ``Harvest.start_workflow`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from harvest_celery._client import Harvest
from harvest_celery._core import events as ev
from harvest_celery._errors import WorkflowCancelledError
from harvest_celery._store.records import Execution

T = TypeVar("T")


class AsyncHarvest:
    """``await``-able ``Harvest`` calls. Wraps an existing ``Harvest`` (its registry, store and
    Celery app); create one per process, like the ``Harvest`` itself, and ``close()`` it on
    shutdown (or use ``async with``)."""

    def __init__(
        self, harvest: Harvest, *, max_workers: int = 8, max_waiters: int = 32, wait_slice: float = 5.0
    ) -> None:
        self.harvest = harvest
        self.wait_slice = wait_slice
        self._calls = ThreadPoolExecutor(max_workers, thread_name_prefix="harvest-async")
        self._waits = ThreadPoolExecutor(max_waiters, thread_name_prefix="harvest-async-wait")

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._calls, partial(fn, *args, **kwargs))

    # ── commands ─────────────────────────────────────────────────────────────────────────────
    async def start_workflow(
        self,
        name: str,
        input: Any = None,
        execution_id: str | None = None,
        *,
        connection: Any = None,
        id_reuse: str = "idempotent",
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        priority: int = 0,
    ) -> str:
        """``Harvest.start_workflow``; ``connection`` may also be an ``AsyncSession`` or
        ``AsyncConnection`` (its transaction is joined through ``run_sync``)."""
        timeouts: dict[str, Any] = {
            "execution_timeout": execution_timeout,
            "run_timeout": run_timeout,
            "priority": priority,
        }
        if connection is not None and hasattr(connection, "run_sync"):

            def on_sync(sync_connection: Any) -> str:
                return self.harvest.start_workflow(
                    name, input, execution_id, connection=sync_connection, id_reuse=id_reuse, **timeouts
                )

            result: str = await connection.run_sync(on_sync)
            return result
        return await self._run(
            self.harvest.start_workflow,
            name,
            input,
            execution_id,
            connection=connection,
            id_reuse=id_reuse,
            **timeouts,
        )

    async def start_task(self, signature_or_task: Any, *args: Any, **kwargs: Any) -> str:
        """``Harvest.start_task``: a durable one-step run of an adopted Celery task."""
        return await self._run(self.harvest.start_task, signature_or_task, *args, **kwargs)

    async def start_canvas(
        self,
        signature: Any,
        *,
        execution_id: str | None = None,
        compensate: dict[str, Any] | None = None,
        retry: Any = None,
        id_reuse: str = "idempotent",
    ) -> str:
        """``Harvest.start_canvas``: a durable run of a Celery canvas (docs/canvas.md)."""
        return await self._run(
            self.harvest.start_canvas,
            signature,
            execution_id=execution_id,
            compensate=compensate,
            retry=retry,
            id_reuse=id_reuse,
        )

    async def signal(self, execution_id: str, name: str, payload: Any = None) -> None:
        await self._run(self.harvest.signal, execution_id, name, payload)

    async def signal_with_start(
        self,
        workflow: str,
        input: Any,
        execution_id: str,
        signal: str,
        payload: Any = None,
        *,
        execution_timeout: timedelta | float | None = None,
        run_timeout: timedelta | float | None = None,
        priority: int = 0,
    ) -> str:
        return await self._run(
            self.harvest.signal_with_start,
            workflow,
            input,
            execution_id,
            signal,
            payload,
            execution_timeout=execution_timeout,
            run_timeout=run_timeout,
            priority=priority,
        )

    async def cancel_workflow_execution(self, execution_id: str, reason: str = "") -> str:
        return await self._run(self.harvest.cancel_workflow_execution, execution_id, reason)

    async def request_cancellation(self, execution_id: str, reason: str = "") -> bool:
        """``Harvest.request_cancellation``: cooperative cancel (the run stays live, shown
        CANCELLING); False if a request was already open."""
        return await self._run(self.harvest.request_cancellation, execution_id, reason)

    async def terminate(self, execution_id: str, reason: str = "") -> None:
        await self._run(self.harvest.terminate, execution_id, reason)

    async def pause(self, execution_id: str) -> None:
        await self._run(self.harvest.pause, execution_id)

    async def resume(self, execution_id: str) -> None:
        await self._run(self.harvest.resume, execution_id)

    # ── reads ────────────────────────────────────────────────────────────────────────────────
    async def describe(self, execution_id: str) -> Execution:
        return await self._run(self.harvest.describe, execution_id)

    async def history(self, execution_id: str, *, strict: bool = True) -> list[ev.HistoryEvent]:
        return await self._run(self.harvest.history, execution_id, strict=strict)

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        nd_blocked: bool | None = None,
        limit: int = 100,
        offset: int = 0,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> list[Execution]:
        """``Harvest.list``: runs, newest first; ``created_after``/``created_before`` bound the
        creation time (inclusive/exclusive)."""
        return await self._run(
            self.harvest.list,
            status=status,
            workflow=workflow,
            nd_blocked=nd_blocked,
            limit=limit,
            offset=offset,
            created_after=created_after,
            created_before=created_before,
        )

    async def query(self, execution_id: str, name: str, arg: Any = None) -> Any:
        """``Harvest.query``: the handler's answer, computed on a call thread (a replay of the
        run's history in this process; nothing is written)."""
        return await self._run(self.harvest.query, execution_id, name, arg)

    async def update(
        self,
        execution_id: str,
        name: str,
        arg: Any = None,
        update_id: str | None = None,
        timeout: float | None = 30.0,
    ) -> Any:
        """``Harvest.update`` on a call thread: the acceptance (validated under the run's lock)
        and the wait for the handler's value."""
        return await self._run(self.harvest.update, execution_id, name, arg, update_id, timeout)

    async def result(self, execution_id: str, timeout: float | None = 30.0, poll: float = 1.0) -> Any:
        """``Harvest.result`` without blocking the loop: waits in slices of ``wait_slice``
        seconds on a waiter thread, so cancelling the awaiting task stops the wait at the end of
        the current slice. Raises as ``Harvest.result`` does (``WorkflowFailed``,
        ``WorkflowCancelledError``, ``TimeoutError``)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = self.wait_slice if left is None else min(self.wait_slice, left)
            try:
                return await loop.run_in_executor(
                    self._waits, partial(self.harvest.result, execution_id, timeout=step, poll=poll)
                )
            except (TimeoutError, WorkflowCancelledError) as exc:
                # a slice ran out: a live run times out, a cancelled one whose cancel branch is
                # still running answers outcome "pending" — both are final only at the deadline
                if isinstance(exc, WorkflowCancelledError) and exc.outcome != "pending":
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    if isinstance(exc, WorkflowCancelledError):
                        raise
                    raise TimeoutError(f"execution {execution_id} did not finish within {timeout}s") from None

    # ── lifecycle ────────────────────────────────────────────────────────────────────────────
    def close(self) -> None:
        """Stop the thread pools (calls already running finish)."""
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._waits.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> AsyncHarvest:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AsyncHarvest"]
