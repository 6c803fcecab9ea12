"""Declaring a DAG: ``@dag``, the ``DagBuilder`` handed to its function, the build-time guards,
the level computation and the registration preflight.

``@dag`` runs its builder function once, at decoration, so every build-time guard fires before a
single node runs; the built ``DagDefinition`` (see ``model``) is registered as an ordinary workflow
whose function is ``runner.make_runner(definition)`` (its info carries the DAG's own name).
Levels are longest-path depths over the upstreams (``depths``, shared with the run page's layout),
ascending declaration order within a level, a signal gate a level of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from harvest_celery._core.registry import Registry, WorkflowDefinition, activity_name
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._dag.model import DagDefinition, FailFast, MapPolicy, Node, depths
from harvest_celery._dag.runner import make_runner
from harvest_celery._errors import (
    CompensatorNameCollidesWithNode,
    DagBuildError,
    UnregisteredActivity,
)

F = TypeVar("F", bound=Callable[..., Any])


# ── declaring nodes ───────────────────────────────────────────────────────────────────────────
class NodeRef:
    """What ``dag.activity(...)`` returns: chain the node's settings."""

    def __init__(self, builder: DagBuilder, node: Node) -> None:
        self._builder = builder
        self._node = node

    @property
    def name(self) -> str:
        return self._node.name

    def _ref(self, other: NodeRef) -> str:
        if not isinstance(other, NodeRef) or other._builder is not self._builder:
            raise DagBuildError(
                f"dag {self._builder.name!r}: task {self.name!r} refers to a node of another DAG builder"
            )
        return other.name

    def _edge(self, name: str) -> None:
        if name not in self._node.upstreams:
            self._node.upstreams.append(name)

    def upstream(self, *nodes: NodeRef) -> NodeRef:
        for node in nodes:
            self._edge(self._ref(node))
        return self

    def compensate(self, fn: Any) -> NodeRef:
        """The activity that undoes this node (at most one; the last call wins)."""
        self._node.compensator = activity_name(fn)
        return self

    def compensate_named(self, name: str) -> NodeRef:
        """Compensator by name (trimmed); it must still be a registered activity."""
        self._node.compensator = name.strip() if isinstance(name, str) else name
        return self

    def queue(self, queue: str) -> NodeRef:
        self._node.queue = queue
        return self

    def retry(self, policy: RetryPolicy) -> NodeRef:
        """Overrides the activity's retry policy for this node only (never its compensator's)."""
        self._node.retry = policy
        return self

    def start_to_close(self, seconds: float) -> NodeRef:
        self._node.start_to_close = seconds
        return self

    def input_from(self, node: NodeRef) -> NodeRef:
        """This node's input is ``node``'s raw output."""
        name = self._ref(node)
        self._edge(name)
        self._node.binding = ("from", name)
        return self

    def input_from_all(self, *nodes: NodeRef) -> NodeRef:
        """This node's input is ``{upstream name: its output, …}``."""
        names = [self._ref(n) for n in nodes]
        for name in names:
            self._edge(name)
        self._node.binding = ("all", names)
        return self

    def input_from_aliased(self, aliases: dict[str, NodeRef] | None = None, /, **kwargs: NodeRef) -> NodeRef:
        """This node's input is ``{alias: that upstream's output, …}``."""
        pairs = [(alias, self._ref(n)) for alias, n in {**(aliases or {}), **kwargs}.items()]
        for _alias, name in pairs:
            self._edge(name)
        self._node.binding = ("aliased", pairs)
        return self

    def over(self, node: NodeRef) -> NodeRef:
        """A mapped node runs one activity per item of ``node``'s output array."""
        if self._node.kind != "mapped":
            raise DagBuildError(
                f"dag {self._builder.name!r}: task {self.name!r} is not a mapped "
                "node; use dag.map_activity(fn).over(...)"
            )
        name = self._ref(node)
        self._edge(name)
        self._node.over = name
        return self

    def policy(self, policy: MapPolicy) -> NodeRef:
        self._node.policy = policy
        return self


class DagBuilder:
    """Handed to a ``@dag`` function to declare its nodes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[Node] = []

    def _add(self, name: str, kind: str, **kw: Any) -> NodeRef:
        if any(n.name == name for n in self.nodes):
            raise DagBuildError(
                f"dag {self.name!r}: two nodes are named {name!r} (a node is named "
                "after its activity or signal; each name may appear once)"
            )
        node = Node(len(self.nodes), name, kind, **kw)
        self.nodes.append(node)
        return NodeRef(self, node)

    def activity(self, fn: Any) -> NodeRef:
        """A node that runs one activity (a decorated function or a registered name)."""
        return self._add(activity_name(fn), "activity")

    def map_activity(self, fn: Any, policy: MapPolicy = FailFast) -> NodeRef:
        """A node that runs ``fn`` once per item of an upstream array (``.over(node)``)."""
        return self._add(activity_name(fn), "mapped", policy=policy)

    def signal_gate(self, signal: str) -> NodeRef:
        """A node that waits for the signal ``signal`` and outputs its payload. A level of its
        own."""
        return self._add(signal, "gate")


# ── building and checking ─────────────────────────────────────────────────────────────────────
def build(name: str, fn: Callable[[DagBuilder], Any]) -> DagDefinition:
    builder = DagBuilder(name)
    fn(builder)
    nodes = builder.nodes
    if not nodes:
        raise DagBuildError(f"dag {name!r} declares no nodes")
    forward = {n.name for n in nodes}
    for node in nodes:
        _check_node(name, node, forward)
    return DagDefinition(name, tuple(nodes), _levels(name, nodes))


def _check_node(dag: str, node: Node, forward: set[str]) -> None:
    task = node.name
    if node.kind == "gate":
        if node.compensator is not None:
            raise DagBuildError(
                f"dag {dag!r}: task {task!r} is a signal gate and cannot have a "
                "compensator; a gate dispatches no activity, so there is nothing to undo"
            )
        if node.binding is not None or node.over is not None:
            raise DagBuildError(
                f"dag {dag!r}: task {task!r} is a signal gate and cannot have an "
                "input binding; use .upstream() to add a dependency"
            )
    if node.compensator is not None:
        if not isinstance(node.compensator, str) or not node.compensator.strip():
            raise DagBuildError(
                f"dag {dag!r}: task {task!r} declares an empty compensator name; "
                "name the activity that undoes this node"
            )
        if node.compensator in forward:
            raise CompensatorNameCollidesWithNode(dag, task, node.compensator)
    if node.kind == "mapped":
        if node.over is None:
            raise DagBuildError(f"dag {dag!r}: mapped task {task!r} needs .over(upstream)")
        if node.binding is not None:
            raise DagBuildError(
                f"dag {dag!r}: task {task!r} declares both an input binding and a "
                "mapped upstream (input_from and map_activity are mutually exclusive)"
            )
    if node.binding is not None:
        kind, spec = node.binding
        if kind in ("all", "aliased") and not spec:
            raise DagBuildError(f"dag {dag!r}: task {task!r} has an input binding with no upstream sources")
        if kind == "aliased":
            keys = [alias for alias, _ in spec]
            if len(keys) != len(set(keys)):
                raise DagBuildError(f"dag {dag!r}: task {task!r} has a duplicate input-binding key")
    if node.name in node.upstreams:
        raise DagBuildError(f"dag {dag!r} contains a dependency cycle (task {task!r} depends on itself)")


def _levels(dag: str, nodes: list[Node]) -> tuple[tuple[Node, ...], ...]:
    """Longest-path levels; ascending declaration index within a level; a signal gate is a level
    of its own (after the level's other nodes)."""

    def cycle(name: str) -> int:
        raise DagBuildError(f"dag {dag!r} contains a dependency cycle (through task {name!r})")

    depth = depths({n.name: n.upstreams for n in nodes}, cycle)
    for node in nodes:
        node.level = depth[node.name]
    out: list[tuple[Node, ...]] = []
    for level in sorted(set(depth.values())):
        members = sorted((n for n in nodes if n.level == level), key=lambda n: n.index)
        plain = tuple(n for n in members if n.kind != "gate")
        if plain:
            out.append(plain)
        out.extend((g,) for g in members if g.kind == "gate")
    return tuple(out)


def preflight(definition: DagDefinition, registry: Registry) -> None:
    """Every node's activity and every compensator must be registered (checked at worker boot and
    before a run starts)."""
    for node in definition.nodes:
        if node.kind != "gate" and node.name not in registry.activities:
            raise UnregisteredActivity(definition.name, node.name, node.name, "activity")
        if node.compensator is not None and node.compensator not in registry.activities:
            raise UnregisteredActivity(definition.name, node.name, node.compensator, "compensator")


def preflight_all(registry: Registry) -> None:
    for definition in registry.workflows.values():
        if definition.kind == "dag":
            preflight(definition.extra, registry)


# ── the decorator ─────────────────────────────────────────────────────────────────────────────
@overload
def dag(fn: F) -> F: ...
@overload
def dag(*, name: str | None = None) -> Callable[[F], F]: ...


def dag(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Declare a DAG: ``def fulfillment(dag: DagBuilder) -> None``. Built (and checked) now."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        dag_name = name or f.__name__
        definition = build(dag_name, f)
        f.__harvest_workflow__ = WorkflowDefinition(  # type: ignore[attr-defined]
            name=dag_name, fn=make_runner(definition), kind="dag", extra=definition
        )
        return f

    return wrap(fn) if fn is not None else wrap
