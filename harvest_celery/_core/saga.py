"""``Saga``: LIFO compensation inside one workflow execution.

The saga has no persistent identity: it is rebuilt from scratch on every replay, and a replay
after a crash mid-unwind re-invokes compensations from the top of the stack — compensations must
be idempotent (docs/concepts.md, "Idempotency contract"). Cancellation never compensates on its
own: the author observes ``ctx.is_cancelled()`` and calls ``compensate_all()``.

Every unwind (``compensate_all``, ``compensate_all_after`` and the automatic rollback of a failed
step) funnels through ``_unwind``, the single place that numbers unwinds and records the
``saga_compensated:{seq}`` / ``saga_compensation_failed:{seq}`` observability markers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from harvest_celery._core.context import WorkflowContext
from harvest_celery._errors import Cancelled, ChildWorkflowFailed, NonDeterministic, SagaCompensationFailed

MANUAL_COMPENSATION = "manual compensation requested"


async def _call(fn: Callable[[], Any]) -> Any:
    result = fn()
    if inspect.isawaitable(result):
        return await result
    return result


class Saga:
    """Register a compensation per completed forward step; unwind them LIFO on failure."""

    def __init__(self, ctx: WorkflowContext) -> None:
        ctx.check_not_in_update("Saga")
        self._ctx = ctx
        self._stack: list[Callable[[], Any]] = []

    def __len__(self) -> int:
        return len(self._stack)

    async def step(self, forward: Callable[[], Any], compensate: Callable[[Any], Any] | None = None) -> Any:
        """Run ``forward``; on success register ``compensate(result)`` and return the result.

        If ``forward`` fails, everything registered so far is rolled back (continue-not-abort)
        and the step's own error is re-raised — or ``SagaCompensationFailed`` if a compensation
        failed. ``Cancelled``, ``NonDeterministic`` and a ``ChildWorkflowFailed`` of a CANCELLED
        child pass through untouched: cancellation never compensates, and a divergence is a
        deploy problem that nd-blocks the run.
        """
        self._ctx.check_not_in_update("Saga.step")
        try:
            result = await _call(forward)
        except (Cancelled, NonDeterministic):
            raise  # cancellation never compensates; a divergence is a deploy problem, not a failure
        except ChildWorkflowFailed as err:
            if err.status == "CANCELLED":
                raise  # a child's cancel never compensates the parent on its own
            await self.compensate_all_after(err)
        except Exception as err:
            await self.compensate_all_after(err)
        if compensate is not None:
            self._stack.append(lambda: compensate(result))
        return result

    def push_compensation(self, compensate: Callable[[], Any]) -> None:
        """Register a compensation without running anything."""
        self._ctx.check_not_in_update("Saga.push_compensation")
        self._stack.append(compensate)

    async def compensate_all(self) -> None:
        """Unwind every registered compensation, LIFO. Raises ``SagaCompensationFailed`` (with
        original error ``manual compensation requested``) if any of them failed."""
        errors = await self._unwind()
        if errors:
            raise SagaCompensationFailed(MANUAL_COMPENSATION, errors)

    async def compensate_all_after(self, error: BaseException) -> None:
        """Unwind, then re-raise ``error`` — or ``SagaCompensationFailed`` carrying it."""
        errors = await self._unwind()
        if errors:
            raise SagaCompensationFailed(error, errors) from error
        raise error

    async def _unwind(self) -> list[BaseException]:
        self._ctx.check_not_in_update("Saga compensation")
        if not self._stack:
            return []  # an empty unwind is not a sequence: no number, no marker, no metric
        stack, self._stack = self._stack, []
        errors: list[BaseException] = []
        with self._ctx.unwinding() as unwind:
            while stack:
                compensation = stack.pop()
                try:
                    await _call(compensation)
                except Exception as err:  # continue-not-abort, NonDeterministic included
                    errors.append(err)
            if errors:
                unwind.failed()
        return errors
