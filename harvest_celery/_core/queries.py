"""Queries: read a run's state through a handler its code registered (``ctx.set_query_handler``).

A query is a pure read (docs/concepts.md, "Queries"). ``answer`` replays the stored history as a
probe (``Activation(probe=True)``: observability markers record and count nothing) on a
``Session`` built for this call and closed after it — never a warm replay a decision worker keeps
(``_runtime.sessions``) — up to the end of the history, discards the commands that replay issues
at the frontier, and then calls the handler with the argument. So the handler sees the state the
next decision will start from, and whatever it changes (a local, the rng) dies with the replay.

While the handler runs, every ``ctx`` command is refused (``Replay.check_running``): the query
fails with ``QueryFailed`` naming the command, even if the handler caught the refusal, and
nothing was issued. A probe that diverges is a ``QueryFailed`` too: the handler would read a
state the history does not support.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from harvest_celery._core import failures
from harvest_celery._core.engine import Activation, Session
from harvest_celery._core.jsonvalues import check_json
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._errors import PayloadNotSerializable, QueryFailed, UnknownQuery


@contextmanager
def probe_session(
    definition: WorkflowDefinition, activation: Activation, registry: Registry
) -> Iterator[Session]:
    """A ``Session`` replaying ``activation.history`` as a probe, built for one call and closed
    after it (queries and update validators): nothing the caller's code changes outlives it."""
    probe = activation if activation.probe else dataclasses.replace(activation, probe=True)
    session = Session(definition, probe, registry)
    try:
        yield session
    finally:
        session.close()


def divergence_text(nd: Mapping[str, Any]) -> str:
    """What a probe that diverged from the history says (a query fails, an update is rejected)."""
    return (
        "the replay that rebuilds the run's state diverged from its history: expected "
        f"{nd['expected']}, got {nd['actual']} at event {nd['event_index']}"
    )


def query_arg(name: str, arg: Any) -> Any:
    """The query's argument as the handler gets it (plain JSON, tuples as lists); else
    ``PayloadNotSerializable``, before anything is read."""
    return check_json(arg, f"argument of query {name!r}")


def answer(
    definition: WorkflowDefinition, activation: Activation, registry: Registry, name: str, arg: Any
) -> Any:
    """Replay ``activation.history`` (as a probe) and return ``handler(arg)`` of query ``name``.

    Raises ``UnknownQuery`` (no handler of that name at the end of the history, listing those
    registered) or ``QueryFailed`` (the replay diverged; the handler raised, issued a ``ctx``
    command, returned an awaitable or a value that is not JSON)."""
    with probe_session(definition, activation, registry) as session:
        return _ask(session, name, arg)


def _ask(session: Session, name: str, arg: Any) -> Any:
    replay = session.replay
    execution_id = replay.activation.execution_id
    nd = session.decision.nd
    if nd is not None:
        raise QueryFailed(execution_id, name, "NonDeterministic", divergence_text(nd))
    handler = replay.query_handlers.get(name)
    if handler is None:
        raise UnknownQuery(execution_id, name, sorted(replay.query_handlers))
    issued = len(replay.commands)  # what the probe issued at the frontier: discarded
    replay.query = name
    try:
        value = handler(arg)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the handler's error is the query's answer
        if replay.query_refused is not None:
            raise replay.query_refused from None
        info = failures.describe(exc, with_traceback=False)
        raise QueryFailed(execution_id, name, info.error_type, info.message) from exc
    finally:
        replay.query = None
    if replay.query_refused is not None:  # refused, and the handler caught the refusal
        raise replay.query_refused
    if len(replay.commands) != issued:  # every command passes check_running: a safety net
        command = type(replay.commands[issued]).__name__
        raise QueryFailed(
            execution_id, name, "QueryCommand", f"the handler issued a {command} command", command
        )
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise QueryFailed(
            execution_id,
            name,
            "TypeError",
            "the handler returned an awaitable: a query handler is a plain function",
        )
    try:
        return check_json(value, f"result of query {name!r}")
    except PayloadNotSerializable as exc:
        raise QueryFailed(execution_id, name, "PayloadNotSerializable", str(exc)) from None


__all__ = ["answer", "query_arg"]
