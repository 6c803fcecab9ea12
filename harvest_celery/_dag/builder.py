"""DAGs with declarative node compensation.

``@dag`` runs its builder function once, at decoration, so every build-time guard fires before a
single node runs. The DAG then runs as an ordinary workflow execution (its info carries the DAG's
own name): levels in forward order, each level's nodes dispatched together in ascending
declaration order and joined (never raced). On terminal failure the succeeded, compensable nodes
that dispatched something are unwound through ``Saga`` — same LIFO order, same markers, same
counters — with the compensation envelope ``{"dag_compensate", "input", "output"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from harvest_celery._core.context import WorkflowContext
from harvest_celery._core.registry import Registry, WorkflowDefinition, activity_name
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._core.saga import Saga
from harvest_celery._errors import (
    ActivityError,
    CompensatorNameCollidesWithNode,
    DagBuildError,
    DagTaskFailed,
    PayloadTooLarge,
    UnregisteredActivity,
)

F = TypeVar("F", bound=Callable[..., Any])

DAG_FAILED = "one or more DAG tasks failed"
NOT_AN_ARRAY = "mapped upstream output is not a JSON array"
ENVELOPE_KEYS = frozenset({"dag_compensate", "input", "output"})



class MapPolicy:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


FailFast = MapPolicy("FailFast")
"""A mapped node fails if any cell fails (every cell is still awaited); not compensated then."""
CollectAll = MapPolicy("CollectAll")
"""A mapped node always succeeds; its output lists each cell as succeeded/failed."""


@dataclass
class Node:
    index: int
    name: str
    kind: str  # "activity", "mapped" or "gate"
    upstreams: list[str] = field(default_factory=list)
    queue: str = ""
    retry: RetryPolicy | None = None
    start_to_close: float | None = None
    compensator: str | None = None
    binding: tuple[str, Any] | None = None  # ("from", name) · ("all", [names]) · ("aliased", [(alias, name)])
    over: str | None = None
    policy: MapPolicy = FailFast
    level: int = 0


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
            raise DagBuildError(f"dag {self._builder.name!r}: task {self.name!r} refers to a node "
                                "of another DAG builder")
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

    def input_from_aliased(self, aliases: dict[str, NodeRef] | None = None, /,
                           **kwargs: NodeRef) -> NodeRef:
        """This node's input is ``{alias: that upstream's output, …}``."""
        pairs = [(alias, self._ref(n)) for alias, n in {**(aliases or {}), **kwargs}.items()]
        for _alias, name in pairs:
            self._edge(name)
        self._node.binding = ("aliased", pairs)
        return self

    def over(self, node: NodeRef) -> NodeRef:
        """A mapped node runs one activity per item of ``node``'s output array."""
        if self._node.kind != "mapped":
            raise DagBuildError(f"dag {self._builder.name!r}: task {self.name!r} is not a mapped "
                                "node; use dag.map_activity(fn).over(...)")
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
            raise DagBuildError(f"dag {self.name!r}: two nodes are named {name!r} (a node is named "
                                "after its activity or signal; each name may appear once)")
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


@dataclass(frozen=True)
class DagDefinition:
    name: str
    nodes: tuple[Node, ...]
    levels: tuple[tuple[Node, ...], ...]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


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
            raise DagBuildError(f"dag {dag!r}: task {task!r} is a signal gate and cannot have a "
                                "compensator; a gate dispatches no activity, so there is nothing to undo")
        if node.binding is not None or node.over is not None:
            raise DagBuildError(f"dag {dag!r}: task {task!r} is a signal gate and cannot have an "
                                "input binding; use .upstream() to add a dependency")
    if node.compensator is not None:
        if not isinstance(node.compensator, str) or not node.compensator.strip():
            raise DagBuildError(f"dag {dag!r}: task {task!r} declares an empty compensator name; "
                                "name the activity that undoes this node")
        if node.compensator in forward:
            raise CompensatorNameCollidesWithNode(dag, task, node.compensator)
    if node.kind == "mapped":
        if node.over is None:
            raise DagBuildError(f"dag {dag!r}: mapped task {task!r} needs .over(upstream)")
        if node.binding is not None:
            raise DagBuildError(f"dag {dag!r}: task {task!r} declares both an input binding and a "
                                "mapped upstream (input_from and map_activity are mutually exclusive)")
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
    by_name = {n.name: n for n in nodes}
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def level_of(node: Node) -> int:
        if node.name in depth:
            return depth[node.name]
        if node.name in visiting:
            raise DagBuildError(f"dag {dag!r} contains a dependency cycle (through task {node.name!r})")
        visiting.add(node.name)
        level = 1 + max((level_of(by_name[u]) for u in node.upstreams), default=-1)
        visiting.discard(node.name)
        depth[node.name] = level
        return level

    for node in nodes:
        node.level = level_of(node)
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


# ── running a DAG ──────────────────────────────────────────────────────────────────────────────
@dataclass
class _Outcome:
    status: str  # "succeeded" · "failed" · "skipped"
    output: Any = None
    input: Any = None
    dispatched: bool = False
    cause: str | None = None  # a pre-dispatch rejection's precise message
    error: str | None = None


def _resolve_input(node: Node, conf: Any, outcomes: dict[str, _Outcome]) -> Any:
    if node.binding is None:
        return {"conf": conf, "dag_task": node.name}
    kind, spec = node.binding
    if kind == "from":
        return outcomes[spec].output
    if kind == "all":
        return {name: outcomes[name].output for name in spec}
    return {alias: outcomes[name].output for alias, name in spec}


async def _run_activity(ctx: WorkflowContext, node: Node, value: Any) -> _Outcome:
    try:
        future = ctx.execute_activity(node.name, value, node.queue, retry=node.retry,
                                      start_to_close=node.start_to_close)
    except PayloadTooLarge as exc:
        # deterministic pre-dispatch rejection: no id, no command, no event; a node failure
        return _Outcome("failed", input=value, cause=f"dag task {node.name!r}: {exc}")
    try:
        return _Outcome("succeeded", await future, value, dispatched=True)
    except ActivityError as exc:
        return _Outcome("failed", input=value, dispatched=True, error=str(exc))


async def _run_mapped(ctx: WorkflowContext, node: Node, items: Any) -> _Outcome:
    if not isinstance(items, list):
        return _Outcome("failed", input=items, cause=NOT_AN_ARRAY)
    if not items:
        return _Outcome("succeeded", [], items, dispatched=False)  # nothing done: never compensated
    try:
        ctx.check_activity_inputs(node.name, items)
    except PayloadTooLarge as exc:
        return _Outcome("failed", input=items, cause=f"dag task {node.name!r}: {exc}")
    futures = [ctx.execute_activity(node.name, item, node.queue, retry=node.retry,
                                    start_to_close=node.start_to_close) for item in items]

    async def cell(future: Any) -> tuple[bool, Any]:
        try:
            return True, await future
        except ActivityError as exc:
            return False, exc.error_message

    cells = await ctx.gather(*(cell(f) for f in futures))
    if node.policy is CollectAll:
        output = [{"status": "succeeded", "value": v} if ok else {"status": "failed", "error": v}
                  for ok, v in cells]
        return _Outcome("succeeded", output, items, dispatched=True)
    errors = [v for ok, v in cells if not ok]
    if not errors:
        return _Outcome("succeeded", [v for _, v in cells], items, dispatched=True)
    return _Outcome("failed", input=items, dispatched=True, error=errors[0])


async def _run_node(ctx: WorkflowContext, node: Node, conf: Any, outcomes: dict[str, _Outcome]) -> _Outcome:
    if node.kind == "gate":
        return _Outcome("succeeded", await ctx.wait_signal(node.name))
    if node.kind == "mapped":
        assert node.over is not None
        return await _run_mapped(ctx, node, outcomes[node.over].output)
    return await _run_activity(ctx, node, _resolve_input(node, conf, outcomes))


def make_runner(definition: DagDefinition) -> Callable[[WorkflowContext, Any], Any]:
    async def run_dag(ctx: WorkflowContext, conf: Any) -> dict[str, Any]:
        outcomes: dict[str, _Outcome] = {}
        # retry-from-node: nodes carried over from the source run succeeded there and their side
        # effects are live, so they count as dispatched (compensable) without running again
        for name, recorded in ctx.info.carried.items():
            outcomes[name] = _Outcome("succeeded", recorded.get("output"), recorded.get("input"),
                                      dispatched=True)
        for level in definition.levels:
            runnable = []
            for node in level:
                if node.name in outcomes:
                    continue
                if all(outcomes[u].status == "succeeded" for u in node.upstreams):
                    runnable.append(node)
                else:
                    outcomes[node.name] = _Outcome("skipped")
            results = await ctx.gather(*(_run_node(ctx, n, conf, outcomes) for n in runnable))
            for node, outcome in zip(runnable, results, strict=True):
                outcomes[node.name] = outcome
        failed = [n for n in definition.nodes if outcomes[n.name].status == "failed"]
        if not failed:
            return {n.name: outcomes[n.name].output for n in definition.nodes
                    if outcomes[n.name].status == "succeeded"}
        causes = [c for c in (outcomes[n.name].cause for n in failed) if c]
        error = DagTaskFailed(causes[0] if causes else DAG_FAILED)
        if ctx.is_cancelled():
            raise error  # a cancelled run never unwinds
        saga = Saga(ctx)
        for level in definition.levels:  # pushed in forward order, unwound LIFO
            for node in level:
                outcome = outcomes[node.name]
                if outcome.status == "succeeded" and outcome.dispatched and node.compensator:
                    saga.push_compensation(_compensation(ctx, node, outcome))
        await saga.compensate_all_after(error)
        raise error  # unreachable: compensate_all_after always raises

    return run_dag


def _compensation(ctx: WorkflowContext, node: Node, outcome: _Outcome) -> Callable[[], Any]:
    envelope = {"dag_compensate": node.name, "input": outcome.input, "output": outcome.output}
    compensator = node.compensator
    # On the node's queue string: empty → the compensator's own default queue → "default". The
    # node's retry/start_to_close overrides are deliberately not applied to its undo.
    return lambda: ctx.execute_activity(compensator, envelope, queue=node.queue)


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
            name=dag_name, fn=make_runner(definition), kind="dag", extra=definition)
        return f

    return wrap(fn) if fn is not None else wrap
