"""What a DAG is, as data: its nodes, its built definition, the map policies, the compensation
envelope and the run's fixed messages.

Nothing here runs or checks anything: ``builder`` fills these in (and guards them), ``runner``
executes them, ``folds``/``graph``/``retry`` read a run's history against them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harvest_celery._core.retry import RetryPolicy

DAG_FAILED = "one or more DAG tasks failed"
"""A failed run's error when no node failed with a precise (pre-dispatch) cause."""
NOT_AN_ARRAY = "mapped upstream output is not a JSON array"
ENVELOPE_KEYS = frozenset({"dag_compensate", "input", "output"})
"""The compensator's input: ``{"dag_compensate": node, "input": its input, "output": its output}``."""


class MapPolicy:
    """How a mapped node turns its cells' outcomes into its own (``FailFast`` or ``CollectAll``)."""

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
    """One declared node. ``level`` is filled in by the build (longest path from a root)."""

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
    # a canvas node (``harvest.start_canvas``): ``name`` is its node id, ``task`` the adopted
    # task it calls and ``canvas`` its stored graph entry (``canvas``); None for declared nodes
    task: str | None = None
    canvas: dict[str, Any] | None = None


@dataclass(frozen=True)
class DagDefinition:
    """A built, checked DAG: nodes in declaration order and the levels it runs in (a signal gate
    is a level of its own)."""

    name: str
    nodes: tuple[Node, ...]
    levels: tuple[tuple[Node, ...], ...]
    # a canvas run's stored graph (``canvas``): its result ref and callbacks; None for a ``@dag``
    canvas: dict[str, Any] | None = None

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


def compensation_envelope(node: str, input: Any, output: Any) -> dict[str, Any]:
    """The input a compensator receives for ``node``."""
    return {"dag_compensate": node, "input": input, "output": output}


def is_envelope(value: Any) -> bool:
    """``value`` has the shape of a DAG compensation envelope ``{dag_compensate, input, output}``."""
    return (
        isinstance(value, dict) and ENVELOPE_KEYS <= value.keys() and isinstance(value["dag_compensate"], str)
    )


def depths(upstreams: Mapping[str, Sequence[str]], on_cycle: Callable[[str], int]) -> dict[str, int]:
    """Longest-path depth of each name over its upstreams (roots are 0), in ``upstreams``' order.

    An upstream that is not a key is ignored. When a cycle is met at a name still being visited,
    ``on_cycle(name)`` either raises or returns the depth to assume for it there.
    """
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def depth_of(name: str) -> int:
        if name in depth:
            return depth[name]
        if name in visiting:
            return on_cycle(name)
        visiting.add(name)
        value = 1 + max((depth_of(u) for u in upstreams[name] if u in upstreams), default=-1)
        visiting.discard(name)
        depth[name] = value
        return value

    for name in upstreams:
        depth_of(name)
    return depth
