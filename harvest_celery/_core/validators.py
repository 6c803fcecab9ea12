"""Validating an update before it is accepted (docs/concepts.md, "Updates").

``validate`` replays the stored history as a probe on a ``Session`` built for the call and
closed after it — never the warm replay a decision worker keeps — to the end of the history
(the state the next decision starts from), finds the handler the code registered under the
update's name, and calls its validator with the argument. The caller does this under the run's
lock, on the history it then appends ``UpdateAccepted`` to, so the validator sees current state.

While the validator runs every ``ctx`` command is refused: the update is rejected naming it,
even if the validator caught the refusal. A probe that diverges rejects the update too: its
handler would run on a state the history does not support.
"""

from __future__ import annotations

import inspect
from typing import Any

from harvest_celery._core import failures
from harvest_celery._core.engine import Activation, Session
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.queries import divergence_text, probe_session
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._errors import UnknownUpdate, UpdateRejected


def update_arg(name: str, arg: Any) -> Any:
    """The update's argument as the handler gets it (plain JSON, tuples as lists); else
    ``PayloadNotSerializable``, before anything is read."""
    return check_json(arg, f"argument of update {name!r}")


def validate(
    definition: WorkflowDefinition, activation: Activation, registry: Registry, name: str, arg: Any
) -> None:
    """Raise ``UnknownUpdate`` (no handler ``name`` at the end of ``activation.history``) or
    ``UpdateRejected`` (the probe diverged; the validator raised, issued a ``ctx`` command or
    returned an awaitable); return None when the update may be accepted."""
    with probe_session(definition, activation, registry) as session:
        _check(session, name, arg)


def _check(session: Session, name: str, arg: Any) -> None:
    replay = session.replay
    execution_id = replay.activation.execution_id
    nd = session.decision.nd
    if nd is not None:
        raise UpdateRejected(execution_id, name, "NonDeterministic", divergence_text(nd))
    handlers = replay.updates.handlers
    handler = handlers.get(name)
    if handler is None:
        raise UnknownUpdate(execution_id, name, sorted(handlers))
    if handler.validator is None:
        return
    replay.updates.validating = name
    try:
        value = handler.validator(arg)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the validator's error is the rejection
        if replay.updates.refused is not None:
            raise replay.updates.refused from None
        info = failures.describe(exc, with_traceback=False)
        raise UpdateRejected(execution_id, name, info.error_type, info.message) from exc
    finally:
        replay.updates.validating = None
    if replay.updates.refused is not None:  # refused, and the validator caught the refusal
        raise replay.updates.refused
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise UpdateRejected(
            execution_id, name, "TypeError", "the validator returned an awaitable: it is a plain function"
        )


__all__ = ["update_arg", "validate"]
