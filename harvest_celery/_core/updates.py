"""Updates inside a replay: the handlers a run registers (``ctx.set_update_handler``), the
delivery of ``UpdateAccepted`` that starts one as a task, and the ``UpdateCompleted`` its end
records (docs/concepts.md, "Updates").

* ``UpdateAccepted`` is an input event, delivered in history order like a signal. Its handler
  is found by name among those the code registered up to that point; none means the code
  changed since the validator accepted it on the same history prefix: a divergence (nd-block).
* The handler runs as a task of the replay loop beside the workflow: it may await activities,
  timers and signals, and every replay runs it at the same position, so it issues the same
  commands.
* When it ends, its ``UpdateCompleted`` (result, or error type and message) is a command matched
  by update id: recorded → consumed; at the frontier → emitted; anything else diverges, so a
  handler that no longer completes where it did diverges like a removed step. A sealed replay
  records none (the update fails with the run's status instead).

The validator runs on a probe built for the call (``_core.validators``), never here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core import failures
from harvest_celery._core.commands import CompleteUpdate
from harvest_celery._core.futures import Future
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._errors import NonDeterministic, UpdateRejected


@dataclass(frozen=True)
class Handler:
    """One registered update handler and its optional validator."""

    fn: Callable[[Any], Any]
    validator: Callable[[Any], Any] | None = None


async def _run(fn: Callable[[Any], Any], arg: Any) -> Any:
    value = fn(arg)
    if inspect.isawaitable(value):
        value = await value
    return value


class Updates:
    """The update state of one replay (``Replay.updates``)."""

    def __init__(self, replay: Any) -> None:
        self.replay = replay
        self.handlers: dict[str, Handler] = {}
        # the update whose validator is running (``_core.validators``): every ctx command is
        # refused meanwhile, and the first refusal is kept (catching it hides nothing)
        self.validating: str | None = None
        self.refused: UpdateRejected | None = None

    def register(
        self, name: str, fn: Callable[[Any], Any] | None, validator: Callable[[Any], Any] | None
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"an update name is a non-empty string, not {name!r}")
        if fn is None:
            self.handlers.pop(name, None)
            return
        if not callable(fn):
            raise TypeError(f"the handler of update {name!r} must be callable")
        if validator is not None and (not callable(validator) or inspect.iscoroutinefunction(validator)):
            raise TypeError(
                f"the validator of update {name!r} must be a plain function (not async): it "
                "answers at once, under the run's lock"
            )
        self.handlers[name] = Handler(fn, validator)

    def refuse(self, api: str) -> UpdateRejected:
        """A ctx command issued by a validator: the update is rejected, nothing was issued."""
        refused = UpdateRejected(
            self.replay.activation.execution_id,
            self.validating or "?",
            "UpdateCommand",
            f"a validator may not call {api} (it only reads state and raises to reject)",
        )
        self.refused = self.refused or refused
        return refused

    def accepted(self, index: int, event: ev.UpdateAccepted) -> Coroutine[Any, Any, Any] | None:
        """The handler's coroutine for a delivered ``UpdateAccepted``; None (and the replay
        diverged) when the code registers no handler of that name here."""
        handler = self.handlers.get(event.name)
        if handler is None:
            # the validator found it on this same prefix: the code changed since (nd-block)
            self.replay.diverge(f"an update handler {event.name!r}", index)
            return None
        return _run(handler.fn, event.arg)

    def completed(self, event: ev.UpdateAccepted, future: Future) -> None:
        """The handler's task ended: match, or emit, its ``UpdateCompleted``."""
        replay = self.replay
        update_id = event.update_id
        try:
            value = check_json(future.result(), f"result of update {event.name!r}")
            command = CompleteUpdate(update_id, value)
        except BaseException as exc:  # noqa: BLE001 - the handler's error is the update's answer
            info = failures.describe(exc, with_traceback=False)
            command = CompleteUpdate(update_id, None, info.error_type, info.message)
        try:
            recorded = replay.match(
                ev.UpdateCompleted, f"UpdateCompleted({update_id})", lambda e: e.update_id == update_id
            )
        except NonDeterministic:
            return  # recorded on the replay when raised (a sealed replay: the seal is in the way)
        if recorded is None and not replay.sealed:
            replay.commands.append(command)


__all__ = ["Handler", "Updates"]
