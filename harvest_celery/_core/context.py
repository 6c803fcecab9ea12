"""``WorkflowContext``: the only door from workflow code to the world.

Every method is deterministic on replay: it either reads the recorded history or issues a command
that the engine matches against it. See docs/concepts.md, "Determinism rules".
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from harvest_celery._errors import Cancelled
from harvest_celery._core.registry import activity_name

if TYPE_CHECKING:
    from harvest_celery._core.engine import Replay, WorkflowInfo, _Future


class WorkflowContext:
    """Handed to every workflow function as its first argument."""

    def __init__(self, replay: Replay, info: WorkflowInfo) -> None:
        self._replay = replay
        self.info = info

    # ── activities, timers, signals ─────────────────────────────────────────────────────────
    def execute_activity(self, activity: Any, input: Any = None, queue: str = "") -> _Future:
        """Dispatch an activity (a decorated function or its name) and return an awaitable of its
        output. ``queue`` empty → the activity's default queue → ``"default"``.

        Raises ``UnknownActivity``, ``PayloadNotSerializable`` or ``PayloadTooLarge`` before
        anything is recorded; awaiting raises ``ActivityError`` if the activity failed for good.
        """
        self._replay.check_running("ctx.execute_activity")
        return self._replay.schedule_activity(activity_name(activity), input, queue)

    def sleep(self, seconds: float) -> _Future:
        """A durable timer: survives worker restarts; fired by the sweeper from Postgres."""
        self._replay.check_running("ctx.sleep")
        return self._replay.start_timer(seconds)

    def wait_signal(self, name: str) -> _Future:
        """Await the next signal called ``name`` (signals are buffered until awaited)."""
        self._replay.check_running("ctx.wait_signal")
        return self._replay.wait_signal(name)

    async def gather(self, *awaitables: Awaitable[Any]) -> list[Any]:
        """Run awaitables concurrently and return their results in argument order.

        Every member is dispatched in argument order and the join settles only when all of them
        have a result — never at the first failure — so live and replay build the same state.
        The first failure in argument order is then raised.
        """
        self._replay.check_running("ctx.gather")
        from harvest_celery._core.engine import _Future

        futures = [self._replay.spawn(a) for a in awaitables]
        if futures:
            join = _Future()
            remaining = [len(futures)]

            def settled(_f: _Future) -> None:
                remaining[0] -= 1
                if remaining[0] == 0:
                    join.set_result(None)

            for f in futures:
                f.add_done_callback(settled)
            await join
        return [f.result() for f in futures]

    # ── cancellation ─────────────────────────────────────────────────────────────────────────
    def is_cancelled(self) -> bool:
        """True for the whole replay once a ``WorkflowCancelled`` is recorded."""
        return self._replay.cancel is not None

    def cancellation_reason(self) -> str | None:
        return self._replay.cancel.reason if self._replay.cancel is not None else None

    def check_cancellation(self) -> None:
        """Raise ``Cancelled`` if the run was cancelled. Runs no compensation."""
        if self._replay.cancel is not None:
            raise Cancelled(self._replay.cancel.reason or "cancelled")

    # ── versioning and deterministic helpers ────────────────────────────────────────────────
    def patched(self, patch_id: str) -> bool:
        """True on new runs (records ``patch:{id}``); False when replaying a history recorded
        before the patch existed."""
        self._replay.check_running("ctx.patched")
        return self._replay.patched(patch_id)

    def now(self) -> datetime:
        """Workflow time: the recorded time of the last history event delivered to the workflow."""
        return self._replay.current_time

    def random(self) -> float:
        """A deterministic pseudo-random float, seeded by the execution id."""
        return self._replay.rng.random()

    def uuid4(self) -> _uuid.UUID:
        """A deterministic UUID4, seeded by the execution id."""
        return _uuid.UUID(int=self._replay.rng.getrandbits(128), version=4)

    @property
    def rng(self) -> _random.Random:
        return self._replay.rng
