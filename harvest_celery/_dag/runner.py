"""Running a built DAG as an ordinary workflow execution, and its declarative unwind.

Levels run in forward order, each level's runnable nodes dispatched together in ascending
declaration order and joined (never raced); a node whose upstream did not succeed is skipped. A
node's input comes from its binding (``_resolve_input``); a mapped node runs one activity per item
of its upstream's array and folds the cells by its ``MapPolicy``.

**DAG unwind order.** On terminal failure the succeeded nodes that dispatched something and
declare a compensator are pushed onto a ``Saga`` in forward level order — ascending declaration
index within a level, a signal gate a level of its own — and unwound LIFO, with the saga's
markers and counters. Each compensator receives the envelope
``{"dag_compensate", "input", "output"}`` on the node's queue. Nodes carried over by a
retry-from-node fork count as dispatched: their side effects are live.

**Cancellation.** Once ``ctx.is_cancelled()``, no new forward node is dispatched: a node whose
dispatch the history does not already record ends ``cancelled`` (its downstream ``skipped``), and
a signal gate still waiting gives up. A run **sealed** by a cancel never starts an unwind and
ends with its original DAG error (``Cancelled`` if no node failed); an unwind that began before
the seal replays, and its compensations past the seal fail (``SagaCompensationFailed``, both
markers), exactly as a hand-written saga's. A **cooperative** request (the run stays live)
unwinds the succeeded nodes durably and ends ``Cancelled`` — or with the DAG error if a node
failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harvest_celery._core.context import WorkflowContext
from harvest_celery._core.saga import Saga
from harvest_celery._dag import canvas
from harvest_celery._dag.model import (
    DAG_FAILED,
    NOT_AN_ARRAY,
    CollectAll,
    DagDefinition,
    Node,
    compensation_envelope,
)
from harvest_celery._errors import ActivityError, Cancelled, DagTaskFailed, HarvestError, PayloadTooLarge


@dataclass
class _Outcome:
    status: str  # "succeeded" · "failed" · "skipped" · "cancelled" (not dispatched: cancelled)
    output: Any = None
    input: Any = None
    dispatched: bool = False
    cause: str | None = None  # a pre-dispatch rejection's precise message
    error: str | None = None
    error_type: str | None = None  # a canvas node's failure, for link_error
    message: str | None = None


# ── one node ──────────────────────────────────────────────────────────────────────────────────
def _resolve_input(node: Node, conf: Any, outcomes: dict[str, _Outcome]) -> Any:
    if node.binding is None:
        return {"conf": conf, "dag_task": node.name}
    kind, spec = node.binding
    if kind == "from":
        return outcomes[spec].output
    if kind == "all":
        return {name: outcomes[name].output for name in spec}
    return {alias: outcomes[name].output for alias, name in spec}


def _new_after_cancel(ctx: WorkflowContext, node: Node) -> bool:
    """Cancelled, and this node's dispatch would be new (not replayed): it is never dispatched."""
    return ctx.is_cancelled() and not ctx.dispatch_recorded(node.name)


async def _run_activity(ctx: WorkflowContext, node: Node, value: Any) -> _Outcome:
    try:
        if ctx.is_cancelled():
            ctx.check_activity_inputs(node.name, [value])  # a pre-dispatch rejection still wins
            if _new_after_cancel(ctx, node):
                return _Outcome("cancelled", input=value)
        future = ctx.execute_activity(
            node.name, value, node.queue, retry=node.retry, start_to_close=node.start_to_close
        )
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
    if _new_after_cancel(ctx, node):
        return _Outcome("cancelled", input=items)
    futures = [
        ctx.execute_activity(
            node.name, item, node.queue, retry=node.retry, start_to_close=node.start_to_close
        )
        for item in items
    ]

    async def cell(future: Any) -> tuple[bool, Any]:
        try:
            return True, await future
        except ActivityError as exc:
            return False, exc.error_message

    cells = await ctx.gather(*(cell(f) for f in futures))
    if node.policy is CollectAll:
        output = [
            {"status": "succeeded", "value": v} if ok else {"status": "failed", "error": v} for ok, v in cells
        ]
        return _Outcome("succeeded", output, items, dispatched=True)
    errors = [v for ok, v in cells if not ok]
    if not errors:
        return _Outcome("succeeded", [v for _, v in cells], items, dispatched=True)
    return _Outcome("failed", input=items, dispatched=True, error=errors[0])


async def _run_canvas_node(ctx: WorkflowContext, node: Node, outcomes: dict[str, _Outcome]) -> _Outcome:
    """A canvas node: its call (the previous result prepended, by Celery's rules) dispatched
    under its recorded call convention and keyed by its node id, after its durable timer."""
    assert node.canvas is not None and node.task is not None
    spec, task = node.canvas, node.task
    value = canvas.node_call(spec, {name: o.output for name, o in outcomes.items()})
    wait = canvas.wait_seconds(spec, ctx.now())
    try:
        if ctx.is_cancelled():
            ctx.check_activity_inputs(task, [value])  # a pre-dispatch rejection still wins
            if not ctx.node_recorded(task, node.name):
                return _Outcome("cancelled", input=value)
        if wait > 0:
            await ctx.sleep(wait, cancellable=True)  # countdown/eta: nothing parked in the broker
        future = ctx.execute_node(
            task, value, node.queue, node.name, canvas.convention(spec), retry=node.retry
        )
    except Cancelled:
        return _Outcome("cancelled", input=value)
    except PayloadTooLarge as exc:
        cause = canvas.CANVAS_FAILED.format(task=task, node=node.name, error=exc)
        return _Outcome("failed", input=value, cause=cause, error_type=type(exc).__name__, message=str(exc))
    try:
        return _Outcome("succeeded", await future, value, dispatched=True)
    except ActivityError as exc:
        cause = canvas.CANVAS_FAILED.format(
            task=task, node=node.name, error=f"{exc.error_type}: {exc.error_message}"
        )
        return _Outcome(
            "failed",
            input=value,
            dispatched=True,
            error=str(exc),
            cause=cause,
            error_type=exc.error_type,
            message=exc.error_message,
        )


async def _run_node(ctx: WorkflowContext, node: Node, conf: Any, outcomes: dict[str, _Outcome]) -> _Outcome:
    if node.canvas is not None:
        return await _run_canvas_node(ctx, node, outcomes)
    if node.kind == "gate":
        try:
            return _Outcome("succeeded", await ctx.wait_signal(node.name, cancellable=True))
        except Cancelled:
            return _Outcome("cancelled")  # a cancel arrived before the gate's signal
    if node.kind == "mapped":
        assert node.over is not None
        return await _run_mapped(ctx, node, outcomes[node.over].output)
    return await _run_activity(ctx, node, _resolve_input(node, conf, outcomes))


# ── the run ───────────────────────────────────────────────────────────────────────────────────
def make_runner(definition: DagDefinition) -> Callable[[WorkflowContext, Any], Any]:
    """The workflow function that runs ``definition``: returns ``{node: output}`` of the
    succeeded nodes, or unwinds and raises ``DagTaskFailed``."""

    async def run_dag(ctx: WorkflowContext, conf: Any) -> dict[str, Any]:
        outcomes: dict[str, _Outcome] = {}
        # retry-from-node: nodes carried over from the source run succeeded there and their side
        # effects are live, so they count as dispatched (compensable) without running again
        for name, recorded in ctx.info.carried.items():
            outcomes[name] = _Outcome(
                "succeeded", recorded.get("output"), recorded.get("input"), dispatched=True
            )
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
        stopped = any(outcomes[n.name].status == "cancelled" for n in definition.nodes)
        if not failed and not stopped:
            if definition.canvas is not None:
                return await _canvas_result(ctx, definition.canvas, outcomes)
            return {
                n.name: outcomes[n.name].output
                for n in definition.nodes
                if outcomes[n.name].status == "succeeded"
            }
        # a canvas run names its failing task and node (every canvas failure has a cause)
        causes = [c for c in (outcomes[n.name].cause for n in failed) if c]
        error: HarvestError = (
            DagTaskFailed(causes[0] if causes else DAG_FAILED)
            if failed
            else Cancelled(ctx.cancellation_reason() or "cancelled")
        )
        if ctx.is_sealed() and not ctx.unwind_recorded():
            raise error  # a sealed run never starts an unwind; one begun before the seal replays
        try:
            await _unwind(ctx, definition, outcomes, error)
        except HarvestError as raised:
            if definition.canvas is not None and failed:
                # link_error runs once, after the unwind has finished (never on a sealed run)
                await _link_error(ctx, definition.canvas, failed[0], outcomes[failed[0].name], raised)
            raise
        raise error  # unreachable: the unwind always raises

    return run_dag


# ── DAG unwind order ──────────────────────────────────────────────────────────────────────────
async def _unwind(
    ctx: WorkflowContext, definition: DagDefinition, outcomes: dict[str, _Outcome], error: HarvestError
) -> None:
    """DAG unwind order: compensations pushed in forward level order (ascending declaration
    index within a level), popped LIFO by the saga, which raises once the unwind is done."""
    saga = Saga(ctx)
    for level in definition.levels:
        for node in level:
            outcome = outcomes[node.name]
            if outcome.status == "succeeded" and outcome.dispatched and node.compensator:
                saga.push_compensation(_compensation(ctx, node, outcome))
    await saga.compensate_all_after(error)


def _compensation(ctx: WorkflowContext, node: Node, outcome: _Outcome) -> Callable[[], Any]:
    envelope = compensation_envelope(node.name, outcome.input, outcome.output)
    compensator = node.compensator
    if node.canvas is not None and compensator is not None:
        # keyed by the node id too; the call convention says what the undo receives (recorded)
        conv = canvas.compensation_convention(node.canvas)
        return lambda: ctx.execute_node(compensator, envelope, node.queue, node.name, conv)
    # On the node's queue string: empty → the compensator's own default queue → "default". The
    # node's retry/start_to_close overrides are deliberately not applied to its undo.
    return lambda: ctx.execute_activity(compensator, envelope, queue=node.queue)


# ── a canvas run's result and callbacks ───────────────────────────────────────────────────────
async def _canvas_result(ctx: WorkflowContext, graph: dict[str, Any], outcomes: dict[str, _Outcome]) -> Any:
    """What ``apply_async().get()`` returns, then each ``link`` run once with it (prepended
    unless the link is immutable); a link that fails for good fails the run (nothing undone)."""
    result = canvas.resolve(graph["result"], {name: o.output for name, o in outcomes.items()})
    for i, link in enumerate(graph.get("link") or []):
        call = canvas.callback_call(link, result)
        try:
            await ctx.execute_node(
                link["task"], call, link.get("queue") or "", f"link.{i}", canvas.convention({})
            )
        except ActivityError as exc:
            raise DagTaskFailed(
                f"the canvas succeeded but its link {link['task']!r} (node link.{i}) failed: "
                f"{exc.error_type}: {exc.error_message}"
            ) from exc
    return result


async def _link_error(
    ctx: WorkflowContext, graph: dict[str, Any], node: Node, outcome: _Outcome, raised: HarvestError
) -> None:
    """Each ``link_error``, once, with ``{task, node, error_type, message}`` of the first failed
    node; one that fails for good is named in the run's error, which stays the failing task's."""
    argument = canvas.error_argument(node, outcome.error_type, outcome.message)
    for i, errback in enumerate(graph.get("link_error") or []):
        call = canvas.callback_call(errback, argument)
        try:
            await ctx.execute_node(
                errback["task"], call, errback.get("queue") or "", f"link_error.{i}", canvas.convention({})
            )
        except ActivityError as exc:
            raised.message = (
                f"{raised.message}; its link_error {errback['task']!r} (node link_error.{i}) failed: "
                f"{exc.error_type}: {exc.error_message}"
            )
            raised.args = (raised.message,)
