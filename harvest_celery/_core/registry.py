"""Definitions and the registry: ``@activity``, ``@workflow`` and what they record.

The decorators only attach a definition to the function; nothing is registered globally.
``Harvest.register`` puts definitions in a ``Registry`` (and creates the Celery tasks), so two
``Harvest`` instances in one process never see each other's names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from harvest_celery._core.admission import NO_ADMISSION, Admission, declare_admission
from harvest_celery._core.limits import NO_LIMITS, Limits, declare
from harvest_celery._core.retry import DEFAULT_RETRY, RetryPolicy
from harvest_celery._errors import DuplicateRegistration, UnknownActivity, UnknownWorkflow

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class ActivityDefinition:
    """One activity: a Celery task of the same name, dispatched to ``default_queue`` unless the
    call names a queue."""

    name: str
    fn: Callable[..., Any] | None
    default_queue: str = DEFAULT_QUEUE
    retry: RetryPolicy = DEFAULT_RETRY
    start_to_close: float | None = None
    # An existing Celery task used by name: it gets the input as its ordinary argument, so for
    # adopted tasks the payload transits the broker.
    adopted: bool = False
    limits: Limits = NO_LIMITS  # concurrency, rate_limit, limit_key (docs/flow-control.md)

    def resolve_queue(self, queue: str) -> str:
        """Empty queue → the activity's default queue → ``"default"``."""
        return queue or self.default_queue or DEFAULT_QUEUE


@dataclass(frozen=True)
class WorkflowDefinition:
    name: str
    fn: Callable[..., Any]
    kind: str = "workflow"  # "workflow" or "dag"
    extra: Any = None  # a DagDefinition for kind == "dag"
    admission: Admission = NO_ADMISSION  # ``@workflow(concurrency=, limit_key=)``


@overload
def activity(fn: F) -> F: ...
@overload
def activity(
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    start_to_close: float | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    limit_key: Callable[[Any], str] | None = None,
) -> Callable[[F], F]: ...


def activity(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    start_to_close: float | None = None,
    concurrency: int | None = None,
    rate_limit: str | None = None,
    limit_key: Callable[[Any], str] | None = None,
) -> Any:
    """Declare an activity: a side-effecting function run as a Celery task of the same name.

    The function takes one JSON value (the input) and returns one JSON value. It must be
    idempotent: delivery is at-least-once. ``concurrency``, ``rate_limit`` and ``limit_key`` are
    global limits (docs/flow-control.md), checked here: a bad value raises at decoration.
    """
    limits = declare(concurrency, rate_limit, limit_key)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(f):
            raise TypeError(f"activity {f.__name__!r} must be a plain function, not async")
        if start_to_close is not None and start_to_close <= 0:
            raise ValueError("start_to_close must be positive")
        f.__harvest_activity__ = ActivityDefinition(  # type: ignore[attr-defined]
            name=name or f.__name__,
            fn=f,
            default_queue=queue,
            retry=retry or DEFAULT_RETRY,
            start_to_close=start_to_close,
            limits=limits,
        )
        return f

    return wrap(fn) if fn is not None else wrap


@overload
def workflow(fn: F) -> F: ...
@overload
def workflow(
    *,
    name: str | None = None,
    concurrency: int | None = None,
    limit_key: Callable[[Any], str] | None = None,
) -> Callable[[F], F]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    concurrency: int | None = None,
    limit_key: Callable[[Any], str] | None = None,
) -> Any:
    """Declare a workflow: ``async def wf(ctx: WorkflowContext, input) -> result``.

    The body must be deterministic: see docs/concepts.md, "Determinism rules". ``concurrency``
    (and ``limit_key``, input → str): at most that many runs admitted at once (per key), the
    others waiting in start order (docs/flow-control.md); checked here.
    """
    admission = declare_admission(concurrency, limit_key)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"workflow {f.__name__!r} must be an async function")
        f.__harvest_workflow__ = WorkflowDefinition(  # type: ignore[attr-defined]
            name=name or f.__name__, fn=f, admission=admission
        )
        return f

    return wrap(fn) if fn is not None else wrap


def activity_name(ref: Any) -> str:
    """The activity name of a decorated function, an ActivityDefinition or a plain name."""
    if isinstance(ref, str):
        return ref
    if isinstance(ref, ActivityDefinition):
        return ref.name
    definition = getattr(ref, "__harvest_activity__", None)
    if definition is None:
        raise TypeError(f"{ref!r} is not an activity: decorate it with @activity or pass its name")
    return str(definition.name)


def workflow_name(ref: Any) -> str:
    """The workflow name of a ``@workflow`` function, a definition or a plain name."""
    if isinstance(ref, str):
        return ref
    definition = ref if isinstance(ref, WorkflowDefinition) else getattr(ref, "__harvest_workflow__", None)
    if not isinstance(definition, WorkflowDefinition):
        raise TypeError(f"{ref!r} is not a workflow: decorate it with @workflow or pass its name")
    return definition.name


@dataclass
class Registry:
    """Names → definitions for one Harvest instance."""

    workflows: dict[str, WorkflowDefinition] = field(default_factory=dict)
    activities: dict[str, ActivityDefinition] = field(default_factory=dict)

    def add_workflow(self, definition: WorkflowDefinition) -> None:
        existing = self.workflows.get(definition.name)
        if existing is not None and existing.fn is not definition.fn:
            raise DuplicateRegistration(definition.kind, definition.name)
        self.workflows[definition.name] = definition

    def add_activity(self, definition: ActivityDefinition) -> None:
        existing = self.activities.get(definition.name)
        if existing is not None and existing.fn is not definition.fn:
            raise DuplicateRegistration("activity", definition.name)
        self.activities[definition.name] = definition

    def has_workflow(self, name: str) -> bool:
        return name in self.workflows

    def workflow(self, name: str) -> WorkflowDefinition:
        try:
            return self.workflows[name]
        except KeyError:
            raise UnknownWorkflow(name) from None

    def activity(self, name: str) -> ActivityDefinition:
        try:
            return self.activities[name]
        except KeyError:
            raise UnknownActivity(name) from None


def register_into(registry: Registry, objects: Any) -> None:
    """Register decorated workflows, DAGs and activities, or every one found in a module."""
    for obj in objects:
        if inspect.ismodule(obj):
            found = [v for v in vars(obj).values() if _definition_of(v) is not None]
            register_into(registry, found)
            continue
        definition = _definition_of(obj)
        if definition is None:
            raise TypeError(f"{obj!r} is not a workflow, dag or activity: decorate it first")
        if isinstance(definition, ActivityDefinition):
            registry.add_activity(definition)
        else:
            registry.add_workflow(definition)


def _definition_of(obj: Any) -> ActivityDefinition | WorkflowDefinition | None:
    for attr in ("__harvest_activity__", "__harvest_workflow__"):
        try:
            definition = getattr(obj, attr, None)
        except Exception:  # noqa: BLE001 - a context proxy in a module (flask.request): not one
            return None
        if isinstance(definition, (ActivityDefinition, WorkflowDefinition)):
            return definition
    return None
