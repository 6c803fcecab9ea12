"""The reserved built-in workflow ``harvest.canvas`` that a ``Harvest.start_canvas`` run is:
its input is the stored graph (``canvas``), from which every decision builds the DAG and runs it
with the declared DAGs' runner (``runner``: levels, joins, the unwind, the cancel edges), keyed by
node id. Registered in every ``Harvest`` registry, as ``harvest.start_task`` is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harvest_celery._core import events as ev
from harvest_celery._core.context import WorkflowContext
from harvest_celery._core.registry import Registry, WorkflowDefinition
from harvest_celery._dag import canvas
from harvest_celery._dag.model import DagDefinition
from harvest_celery._dag.runner import make_runner
from harvest_celery._errors import CanvasNotSupported


def version_refused(graph: Any) -> CanvasNotSupported:
    version = graph.get("canvas") if isinstance(graph, dict) else None
    return CanvasNotSupported(
        "canvas_version",
        f"this run's stored canvas graph has schema version {version!r}; this release reads "
        f"version {canvas.CANVAS_VERSION} only",
    )


async def canvas_workflow(ctx: WorkflowContext, graph: Any) -> Any:
    """Run the stored graph: built from history only, never recompiled."""
    if not canvas.readable(graph):
        raise version_refused(graph)
    return await make_runner(canvas.definition(graph))(ctx, None)


def register_canvas(registry: Registry) -> None:
    registry.add_workflow(WorkflowDefinition(canvas.CANVAS, canvas_workflow, kind="canvas"))


UNREADABLE = (
    "this canvas run's stored graph cannot be read (its payloads were erased, or it was written by "
    "a newer release): its state is the run's, its nodes are not shown"
)


def run_definition(
    definition: WorkflowDefinition, history: Sequence[ev.HistoryEvent]
) -> tuple[DagDefinition | None, str | None]:
    """The DAG a run graph draws for a run of ``definition``, and a note: a ``@dag``'s registered
    definition; a canvas run's built from its stored graph (no nodes, and the note, when that
    graph was erased or cannot be read); ``None`` for any other workflow."""
    if definition.kind == "dag":
        return definition.extra, None
    if definition.kind != "canvas":
        return None, None
    graph = getattr(history[0].event, "input", None) if history else None
    if canvas.readable(graph):
        return canvas.definition(graph), None
    return DagDefinition(canvas.CANVAS, (), ()), UNREADABLE
