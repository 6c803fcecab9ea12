"""Operator actions on runs: terminate, pause, resume, reset, retry a DAG run, erase, purge."""

from __future__ import annotations

import uuid
from typing import Any

from harvest_celery._client_base import ClientBase
from harvest_celery._core.ids import check_execution_id, derived_id
from harvest_celery._core.lifecycle import COMPLETED, RUNNING
from harvest_celery._core.registry import WorkflowDefinition
from harvest_celery._dag import canvas
from harvest_celery._dag import retry as dag_retry
from harvest_celery._dag.canvas_run import version_refused
from harvest_celery._dag.model import DagDefinition
from harvest_celery._dag.retry import COMPENSATED, compensation_executed, erased_refusal
from harvest_celery._errors import ExecutionNotFound, RetryRefused, UnknownWorkflow
from harvest_celery._store import runs as ops
from harvest_celery._store.records import utcnow


class Operations(ClientBase):
    """``Harvest``'s operator actions (docs/operations.md)."""

    def terminate(self, execution_id: str, reason: str = "") -> None:
        """Seal a live run at once, without the post-cancel decision (no workflow code runs)."""
        with self.store.begin() as tx:
            ops.terminate(tx, execution_id, reason, utcnow(), self.runtime.settings.decision_queue)
        self._after(tx)

    def pause(self, execution_id: str) -> None:
        """Hold the run's decisions until ``resume`` (activities already running finish)."""
        with self.store.begin() as tx:
            ops.pause(tx, execution_id, utcnow())
        self._after(tx)

    def resume(self, execution_id: str) -> None:
        with self.store.begin() as tx:
            ops.resume(tx, execution_id, utcnow(), self.runtime.settings.decision_queue)
        self._after(tx)

    def reset(self, execution_id: str, to_seq: int, new_execution_id: str | None = None) -> str:
        """Fork a new run from the first ``to_seq`` events of this one (a live source is
        terminated); returns the new run's id."""
        self.store.get(execution_id)
        new_id = check_execution_id(
            new_execution_id or derived_id(execution_id, f"reset-{uuid.uuid4().hex[:8]}")
        )
        with self.store.begin() as tx:
            ops.reset(
                tx,
                execution_id,
                new_id,
                to_seq,
                self.registry,
                utcnow(),
                self.runtime.settings.decision_queue,
            )
        self._after(tx)
        return new_id

    def retry_dag_run(
        self,
        dag_name: str,
        execution_id: str,
        from_node: str | None = None,
        *,
        dry_run: bool = False,
        new_execution_id: str | None = None,
    ) -> dict[str, Any]:
        """Retry a failed DAG run from a node (default: its first failed node): a new run that
        carries over the succeeded nodes and re-runs that node and everything downstream.

        Raises ``RetryRefused`` for a run that is still running or completed, that executed its
        compensation unwind, or whose payloads were erased; ``UnknownNode``; and a payload error
        when the history cannot be fully decoded (it fails closed).
        """
        definition = self.registry.workflow(dag_name)
        if definition.kind not in ("dag", "canvas"):
            raise UnknownWorkflow(dag_name)
        row = self.store.get(execution_id)
        if row.workflow_type != dag_name:
            raise ExecutionNotFound(execution_id)
        if row.erased_at is not None:
            raise erased_refusal(execution_id)  # the fast path; rechecked under the fork's lock
        if row.status == RUNNING:
            raise RetryRefused(execution_id, "running", f"run {execution_id} is still running")
        if row.status == COMPLETED:
            raise RetryRefused(execution_id, "completed", f"run {execution_id} completed: nothing to retry")
        if row.forked_to is not None and not dry_run:
            raise RetryRefused(
                execution_id,
                "retried",
                f"run {execution_id} was already retried as {row.forked_to}; retry that run instead",
            )
        history = self.store.history(execution_id, strict=True)  # decode before filtering
        if compensation_executed(history):
            raise RetryRefused(execution_id, "compensated", COMPENSATED)
        plan = dag_retry.plan_retry(_dag_of(definition, execution_id, history), history, from_node)
        answer: dict[str, Any] = {
            "source_run_id": execution_id,
            "retry_from": plan.retry_from,
            "carried": sorted(plan.carried),
            "rerun": plan.rerun,
        }
        if dry_run:
            return {**answer, "run_id": None, "dry_run": True}
        new_id = check_execution_id(
            new_execution_id or derived_id(execution_id, f"retry-{uuid.uuid4().hex[:8]}")
        )
        started = history[0].event
        conf = getattr(started, "input", None)
        with self.store.begin() as tx:
            ops.fork_dag_run(
                tx, execution_id, new_id, conf, plan.carried, utcnow(), self.runtime.settings.decision_queue
            )
        self._after(tx)
        return {**answer, "run_id": new_id, "dry_run": False}

    def erase_payloads(self, execution_id: str, *, with_forks: bool = False) -> dict[str, Any]:
        """Tombstone every payload field of a terminal run (PII erasure): the run stays readable
        (names, statuses, timings), its inputs and outputs are gone, offloaded blobs deleted.

        Forks made by ``reset`` or ``retry_dag_run`` hold copies of the run's payloads (and it of
        theirs): while one of that fork family is not erased, this raises ``ForksHoldCopies``
        naming them and writes nothing, unless ``with_forks=True``, which erases every run of
        the family in one transaction (``forks`` in the answer lists the others)."""
        return self.store.erase(execution_id, with_forks=with_forks)

    def purge(self, older_than_days: float, batch: int = 500) -> dict[str, int]:
        """Retention: delete terminal runs closed more than ``older_than_days`` ago."""
        return self.store.purge(older_than_days, batch)


def _dag_of(definition: WorkflowDefinition, execution_id: str, history: Any) -> DagDefinition:
    """A ``@dag``'s registered definition, or a canvas run's, built from its stored graph (the
    fork copies that graph unchanged); a schema version this release cannot read is refused."""
    if definition.kind == "dag":
        return definition.extra  # type: ignore[no-any-return]
    graph = getattr(history[0].event, "input", None)
    if not canvas.readable(graph):
        raise RetryRefused(execution_id, "canvas_version", str(version_refused(graph)))
    return canvas.definition(graph)
