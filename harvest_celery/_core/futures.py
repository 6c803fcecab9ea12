"""The one awaitable workflow code may await: a future the replay loop resolves from history."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any


class Future:
    """The only awaitable a workflow may await (besides coroutines that await these)."""

    __slots__ = ("_done", "_result", "_exc", "_callbacks")

    def __init__(self) -> None:
        self._done = False
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        if not self._done:
            self._done, self._result = True, value
            self._fire()

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._done, self._exc = True, exc
            self._fire()

    def result(self) -> Any:
        if self._exc is not None:
            raise self._exc
        return self._result

    def add_done_callback(self, cb: Callable[[Future], None]) -> None:
        if self._done:
            cb(self)
        else:
            self._callbacks.append(cb)

    def _fire(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def __await__(self) -> Generator[Future, None, Any]:
        if not self._done:
            yield self
        return self.result()
