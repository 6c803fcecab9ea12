"""The one exception tree of harvest-celery.

::

    HarvestError
    ├── Cancelled                      check_cancellation() on a cancelled run
    ├── NonDeterministic               replay diverged from the recorded history
    ├── SagaCompensationFailed         an unwind finished with compensation errors
    ├── PayloadTooLarge                an activity input over the configured cap
    ├── PayloadNotSerializable         a value that is not JSON
    ├── PayloadCodecError              an encoded payload cannot be decoded
    ├── PayloadStoreError              an offloaded payload cannot be inflated
    ├── ActivityError                  an activity failed for good (seen by the workflow)
    ├── StartToCloseTimeout            an attempt ran past its start_to_close
    ├── BodyInterrupted                what Celery sees of an attempt whose body raised a
    │                                  BaseException (SystemExit, KeyboardInterrupt, …)
    ├── RedactedActivityError          what Celery sees of a failed attempt when error detail
    │                                  is limited to the exception type
    ├── WorkflowFailed                 the run ended FAILED (raised by Harvest.result)
    ├── WorkflowCancelledError, WorkflowTimedOut   cancelled, or TIMED_OUT (Harvest.result)
    ├── ChildWorkflowFailed            a child workflow ended other than COMPLETED (seen by
    │                                  its parent)
    ├── UnknownQuery                   a query name the run registered no handler for (HTTP 404)
    ├── QueryFailed                    a query handler raised or issued a ctx command, or the
    │                                  probe replay diverged (HTTP 400)
    ├── UnknownUpdate                  an update name the run registered no handler for (404)
    ├── UpdateRejected                 its validator raised; nothing was written (HTTP 400)
    ├── UpdateFailed                   its handler raised, or the run closed first (HTTP 400)
    ├── RegistrationError
    │   ├── UnknownWorkflow
    │   ├── UnknownActivity
    │   └── DuplicateRegistration
    ├── NotInWorkflow                  an engine API called outside a workflow
    ├── NotInActivity                  activity_context() outside an activity body
    ├── ExecutionNotFound
    ├── ExecutionAlreadyExists         an id reused: for another workflow type, with another
    │                                  input, or under id_reuse="reject" (HTTP 409)
    ├── InvalidExecutionId             an id that cannot name a run (also a ValueError)
    ├── InvalidTaskCall                a durable call of an adopted task Celery's way that
    │   │                              harvest refuses (an option, a rule; also a ValueError)
    │   └── CanvasNotSupported         a canvas shape harvest.start_canvas cannot run durably
    ├── InvalidState                   an operation the run's status forbids
    │   └── ForksHoldCopies            an erasure refused while forks hold copies
    ├── UnknownEventType               a history event this build does not know
    ├── CorruptHistory                 a stored history that cannot be replayed as it is
    ├── DagBuildError                  build-time DAG misuse (raised at decoration)
    │   └── CompensatorNameCollidesWithNode
    ├── UnregisteredActivity           preflight: a DAG names an unregistered activity
    ├── DagTaskFailed                  a DAG run's terminal failure
    ├── RetryRefused                   retry-from-node refused (HTTP 409)
    ├── UnknownNode                    retry from a node the DAG does not declare (HTTP 400)
    ├── InvalidSchedule                a schedule argument harvest cannot take (also a ValueError)
    ├── ScheduleNotFound
    ├── ScheduleAlreadyExists          create_schedule of a name that exists
    └── BeatImportRefused              import_beat entries harvest cannot honour, each named
                                       with why (also a ValueError); nothing was written

Every error carries structured fields and pickles across processes (``__reduce__``), because
errors cross Celery. This module imports nothing of the package, so every layer may raise
from it.
"""

from __future__ import annotations

from typing import Any


class HarvestError(Exception):
    """Root of every error harvest-celery raises."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type[HarvestError], state: dict[str, Any]) -> HarvestError:
    err = cls.__new__(cls)
    Exception.__init__(err, state.get("message", ""))
    err.__dict__.update(state)
    return err


class Cancelled(HarvestError):
    """The run was cancelled; raised by ``ctx.check_cancellation()``. Never compensates."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class NonDeterministic(HarvestError):
    """Replay issued a command that does not match the recorded history.

    A ``HarvestError`` so that ``Saga`` collects it like any compensation error; the engine records
    the details on the run the moment it is raised, so catching it hides nothing.
    """

    def __init__(self, expected: str, actual: str, event_index: int, workflow_type: str = "") -> None:
        super().__init__(f"expected {expected}, got {actual}")
        self.expected, self.actual, self.event_index = expected, actual, event_index
        self.workflow_type = workflow_type

    def details(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "actual": self.actual,
            "event_index": self.event_index,
            "workflow_type": self.workflow_type,
        }


class SagaCompensationFailed(HarvestError):
    """An unwind ran every compensation and at least one failed (continue-not-abort)."""

    def __init__(self, original_error: BaseException | str, compensation_errors: list[Any]) -> None:
        self.original_error, self.compensation_errors = original_error, list(compensation_errors)
        rendered = ", ".join(str(e) for e in self.compensation_errors)
        super().__init__(
            f"saga compensation failed after original error: {original_error}; "
            f"compensation errors: [{rendered}]"
        )


class PayloadTooLarge(HarvestError):
    """An activity input (or compensation envelope) is over the configured cap."""

    def __init__(self, what: str, size: int, cap: int) -> None:
        super().__init__(f"payload too large: {what} is {size} bytes, over the cap of {cap} bytes")
        self.what, self.size, self.cap = what, size, cap


class InvalidLimitKey(HarvestError):
    """A ``limit_key`` raised, returned a non-string or over 200 characters: an activity's raised into
    the workflow before anything is recorded; a workflow's (``kind="workflow"``) before any run."""

    def __init__(self, activity_name: str, reason: str, kind: str = "activity") -> None:
        super().__init__(f"invalid limit key for {kind} {activity_name!r}: {reason}")
        self.activity_name, self.reason, self.kind = activity_name, reason, kind


class PayloadNotSerializable(HarvestError):
    """A workflow input, activity input/output, signal or result that is not JSON."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} is not JSON-serialisable: {reason}")
        self.what, self.reason = what, reason


class ActivityError(HarvestError):
    """An activity failed for good: its retries are exhausted or the error is non-retryable."""

    def __init__(self, activity_name: str, error_type: str, error_message: str, attempts: int = 1) -> None:
        super().__init__(
            f"activity {activity_name} failed after {attempts} attempt(s): {error_type}: {error_message}"
        )
        self.activity_name, self.error_type, self.error_message = activity_name, error_type, error_message
        self.attempts = attempts


class WorkflowFailed(HarvestError):
    """The run ended FAILED; ``Harvest.result`` raises this with the recorded error."""

    def __init__(self, execution_id: str, error_type: str, error_message: str) -> None:
        super().__init__(f"workflow {execution_id} failed: {error_type}: {error_message}")
        self.execution_id, self.error_type, self.error_message = execution_id, error_type, error_message


class ChildWorkflowFailed(HarvestError):
    """A child workflow ended any way but COMPLETED (``ctx.execute_child_workflow``): its id,
    its final ``status`` and its ``error`` (``"<type>: <message>"``, or None)."""

    def __init__(self, child_id: str, status: str, error: str | None = None) -> None:
        super().__init__(f"child workflow {child_id} ended {status}" + (f": {error}" if error else ""))
        self.child_id, self.status, self.error = child_id, status, error


class WorkflowCancelledError(HarvestError):
    """``Harvest.result`` on a run that was cancelled, once its cancel branch has settled (no
    decision pending, no body running), carrying what the branch did — ``outcome``:

    * ``returned``: the workflow returned ``value`` after the cancel;
    * ``cancelled``: it raised ``Cancelled`` (the clean exit of a cancel branch);
    * ``failed``: it raised anything else, ``error`` (``"<type>: <message>"``), e.g. a
      ``SagaCompensationFailed`` whose durable compensations diverged against the seal;
    * ``stopped``: it was left waiting on something that will never come (a signal, a cancelled
      activity) and has no outcome;
    * ``pending``: ``result()`` timed out before the branch settled.
    """

    OUTCOMES = ("returned", "cancelled", "failed", "stopped", "pending")

    def __init__(
        self, execution_id: str, reason: str, error: str | None = None, outcome: str = "", value: Any = None
    ) -> None:
        message = f"workflow {execution_id} was cancelled: {reason}"
        if outcome == "returned":
            message += f" (the cancel branch returned {value!r})"
        elif outcome == "stopped":
            message += " (the cancel branch stopped: it waits on something that can no longer arrive)"
        elif outcome == "pending":
            message += " (the cancel branch has not settled yet)"
        elif error and outcome == "cancelled":
            message += f" (the cancel branch raised {error})"
        elif error:
            message += f" (cancel branch failed: {error})"
        super().__init__(message)
        self.execution_id, self.reason, self.error = execution_id, reason, error
        self.outcome, self.value = outcome, value


class WorkflowTimedOut(HarvestError):
    """``Harvest.result`` on a TIMED_OUT run: its ``timeout`` (execution or run) expired; ``reason``
    and what its cancel branch did (``outcome``, ``error``, ``value``) as for a cancel's error."""

    def __init__(
        self, execution_id: str, timeout: str, reason: str, outcome: str, error: Any = None, value: Any = None
    ) -> None:
        branch = WorkflowCancelledError(execution_id, reason, error, outcome, value)  # the same words
        super().__init__(branch.message.replace("was cancelled", "timed out", 1))
        self.timeout = timeout
        self.__dict__.update({k: v for k, v in vars(branch).items() if k != "message"})


class UnknownQuery(HarvestError):
    """``Harvest.query`` of a name the run has no handler for (``ctx.set_query_handler``) at
    the end of its history; ``known`` lists the names it registered, sorted."""

    def __init__(self, execution_id: str, name: str, known: list[str]) -> None:
        names = ", ".join(repr(k) for k in known) if known else "none"
        super().__init__(f"execution {execution_id!r} has no query handler {name!r} (registered: {names})")
        self.execution_id, self.name, self.known = execution_id, name, list(known)


class QueryFailed(HarvestError):
    """``Harvest.query`` could not answer: the handler raised (``error_type``, ``error_message``),
    issued a ``ctx`` command (``error_type`` ``"QueryCommand"``, ``command`` naming it), returned
    a value that is not JSON, or the replay that rebuilt the run's state diverged (``error_type``
    ``"NonDeterministic"``). Nothing was written either way."""

    def __init__(
        self, execution_id: str, name: str, error_type: str, error_message: str, command: str = ""
    ) -> None:
        super().__init__(
            f"query {name!r} of execution {execution_id!r} failed: {error_type}: {error_message}"
        )
        self.execution_id, self.name = execution_id, name
        self.error_type, self.error_message = error_type, error_message
        self.command = command


class UnknownUpdate(HarvestError):
    """``Harvest.update`` of a name the run has no handler for (``ctx.set_update_handler``) at
    the end of its history; ``known`` lists those it registered, sorted. Nothing was written."""

    def __init__(self, execution_id: str, name: str, known: list[str]) -> None:
        names = ", ".join(repr(k) for k in known) if known else "none"
        super().__init__(f"execution {execution_id!r} has no update handler {name!r} (registered: {names})")
        self.execution_id, self.name, self.known = execution_id, name, list(known)


class UpdateRejected(HarvestError):
    """The update's validator raised (its ``error_type``, ``error_message``) or issued a ``ctx``
    command (``"UpdateCommand"``), or the probe replay diverged: nothing was written."""

    verb = "was rejected"

    def __init__(self, execution_id: str, name: str, error_type: str, error_message: str) -> None:
        HarvestError.__init__(
            self, f"update {name!r} of execution {execution_id!r} {self.verb}: {error_type}: {error_message}"
        )
        self.execution_id, self.name = execution_id, name
        self.error_type, self.error_message = error_type, error_message


class UpdateFailed(HarvestError):
    """An accepted update did not return: its handler raised (``error_type``, ``error_message``),
    or the run closed before it completed (``error_type`` ``"RunClosed"``, naming the status)."""

    verb = "failed"
    __init__ = UpdateRejected.__init__  # the same fields; the message says "failed"


class RegistrationError(HarvestError):
    """A definition could not be registered or resolved."""


class UnknownWorkflow(RegistrationError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown workflow {name!r}: no workflow or dag of that name is registered")
        self.name = name


class UnknownActivity(RegistrationError):
    def __init__(self, name: str, message: str = "") -> None:
        super().__init__(message or f"unknown activity {name!r}: no activity of that name is registered")
        self.name = name


class InvalidTaskCall(HarvestError, ValueError):
    """A durable call of an adopted task (``ctx.execute_task``, ``Harvest.start_task``) that is
    refused before anything is written: a refused call option, an immutable signature given more
    arguments, a naive ``eta``, ``countdown`` with ``eta``, a negative ``countdown``, a signature
    passed to ``ctx.execute_task``, or a schema older than the call convention. ``option`` names
    the option or the rule."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


class CanvasNotSupported(InvalidTaskCall):
    """A canvas shape ``Harvest.start_canvas`` refuses (``propagate=False``, an inner ``link``,
    an unknown canvas type, an unreadable stored graph). ``option`` names the shape."""


class DuplicateRegistration(RegistrationError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"duplicate registration: {kind} {name!r} is already registered")
        self.kind, self.name = kind, name


class NotInWorkflow(HarvestError):
    """A workflow-only API was called outside a running workflow."""

    def __init__(self, api: str) -> None:
        super().__init__(f"{api} can only be called from inside a running workflow")
        self.api = api


class NotInActivity(HarvestError):
    """``harvest_celery.activity_context()`` was called outside an activity body the engine
    runs (it is set up around every claimed body)."""

    def __init__(self, api: str) -> None:
        super().__init__(f"{api} can only be called from inside an activity body run by harvest")
        self.api = api


class ExecutionNotFound(HarvestError):
    def __init__(self, execution_id: str) -> None:
        super().__init__(f"no execution with id {execution_id!r}")
        self.execution_id = execution_id


class ExecutionAlreadyExists(HarvestError):
    """A run with this id exists and the start may not reuse it. ``conflict`` names why:

    * ``"workflow"``: it is a run of another workflow (``workflow_type``; ``requested`` is the
      one asked for);
    * ``"input"``: same workflow, different input (compared by the input digest stored at
      start, so it holds for encrypted and erased runs too);
    * ``"exists"``: the id is taken and the caller asked for a new run only
      (``id_reuse="reject"``, a reset or retry onto an existing id).

    ``status`` is the existing run's status when known."""

    CONFLICTS = ("workflow", "input", "exists")

    def __init__(
        self,
        execution_id: str,
        workflow_type: str,
        conflict: str = "exists",
        *,
        requested: str = "",
        status: str = "",
    ) -> None:
        if conflict == "workflow":
            message = (
                f"execution {execution_id!r} already exists as a {workflow_type!r} run; "
                f"cannot start it as a {requested!r} run"
            )
        elif conflict == "input":
            message = (
                f"execution {execution_id!r} already exists as a {workflow_type!r} run "
                "started with a different input (start it with the same input, pick "
                'another id, or pass id_reuse="use_existing" to get the existing run)'
            )
        else:
            message = f"execution {execution_id!r} already exists as a {workflow_type!r} run"
        if status:
            message += f" [{status}]"
        super().__init__(message)
        self.execution_id, self.workflow_type, self.conflict = execution_id, workflow_type, conflict
        self.requested, self.status = requested, status


class InvalidExecutionId(HarvestError, ValueError):
    """An execution id that cannot name a run: empty, longer than 200 characters, or holding
    ``:``, ``/`` or a control character (they would be unreachable through the HTTP API and
    ambiguous in task ids). Raised before anything is written; a ``ValueError`` too."""

    def __init__(self, execution_id: Any, reason: str) -> None:
        super().__init__(f"invalid execution id {execution_id!r}: {reason}")
        self.execution_id, self.reason = execution_id, reason


class InvalidState(HarvestError):
    """The operation is not allowed in the run's current status."""

    def __init__(self, execution_id: str, status: str, operation: str) -> None:
        super().__init__(f"cannot {operation} execution {execution_id!r}: it is {status}")
        self.execution_id, self.status, self.operation = execution_id, status, operation


class ForksHoldCopies(InvalidState):
    """Erasure refused: other runs of the run's fork family (the runs a reset or a DAG retry
    forked from it or it from them) still hold copies of its payloads (HTTP 409). ``forks``
    names them; erasing with ``with_forks`` erases the whole family at once."""

    def __init__(self, execution_id: str, forks: list[str]) -> None:
        names = ", ".join(repr(f) for f in forks)
        HarvestError.__init__(
            self,
            f"cannot erase the payloads of execution {execution_id!r}: the runs of its fork "
            f"family {names} hold copies of them; erase them with it (with_forks=True, "
            f'harvest erase --with-forks, or the API body {{"with_forks": true}})',
        )
        self.execution_id = execution_id
        self.status = "forked"
        self.operation = "erase the payloads of"
        self.forks = list(forks)


class PayloadCodecError(HarvestError):
    """An encoded payload cannot be decoded (unknown codec or key, tampered ciphertext)."""

    def __init__(self, message: str, *, codec: str = "", key_id: str = "") -> None:
        super().__init__(message)
        self.codec, self.key_id = codec, key_id


class PayloadStoreError(HarvestError):
    """A reference cannot be inflated (foreign store, missing blob, no store configured)."""

    def __init__(self, message: str, *, key: str = "", store_id: str = "") -> None:
        super().__init__(message)
        self.key, self.store_id = key, store_id


class UnknownEventType(HarvestError):
    def __init__(self, type_name: str) -> None:
        super().__init__(f"unknown event type {type_name!r} in history (written by a newer build?)")
        self.type_name = type_name


class RetryRefused(HarvestError):
    """The run cannot be retried (HTTP 409; canvas_version: a canvas graph this release cannot
    read). ``reason``: compensated · erased · running · completed · retried · canvas_version."""

    def __init__(self, execution_id: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.execution_id, self.reason = execution_id, reason


class UnknownNode(HarvestError):
    """Retry from a node the DAG does not declare (HTTP 400)."""

    def __init__(self, dag: str, node: str) -> None:
        super().__init__(f"dag {dag!r} has no node {node!r}")
        self.dag, self.node = dag, node


class DagBuildError(HarvestError):
    """A DAG definition misuses the builder; raised at decoration, before any node runs."""


class CompensatorNameCollidesWithNode(DagBuildError):
    def __init__(self, dag: str, task: str, compensator: str) -> None:
        super().__init__(
            f"dag {dag!r}: task {task!r} declares compensator {compensator!r}, which is also the "
            "name of a forward node; a compensation dispatched under a node's name would be read "
            "back as that node by the run graph and retry-from-node"
        )
        self.dag, self.task, self.compensator = dag, task, compensator


class UnregisteredActivity(HarvestError):
    """Preflight: a DAG names an activity (or compensator) that is not registered."""

    def __init__(self, dag: str, task: str, name: str, role: str) -> None:
        if role == "compensator":
            message = f"dag '{dag}' references unregistered compensator '{name}' for task '{task}'"
        else:
            message = f"dag '{dag}' references unregistered activity '{name}' for task '{task}'"
        super().__init__(message)
        self.dag, self.task, self.name, self.role = dag, task, name, role


class DagTaskFailed(HarvestError):
    """The DAG's terminal failure: ``one or more DAG tasks failed``, or the precise cause of a
    pre-dispatch rejection."""


class StartToCloseTimeout(HarvestError):
    """The attempt ran past its activity's ``start_to_close``."""


class RedactedActivityError(HarvestError):
    """A failed activity attempt as Celery (Flower, error trackers) sees it when
    ``celery_error_detail="type"``: the exception type only; the full text stays in Postgres."""

    def __init__(self, error_type: str, task_id: str) -> None:
        super().__init__(
            f"{error_type} (message redacted; the full error is recorded for attempt "
            f"{task_id}: harvest show <run id>)"
        )
        self.error_type, self.task_id = error_type, task_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.error_type, self.task_id))


# ── the HTTP face of an error: one mapping for the API and the Django/Flask integrations ─────
def http_status(exc: BaseException) -> int:
    """404 unknown (execution, workflow, activity), 409 a conflict with the run's state or id
    (``ExecutionAlreadyExists``, ``InvalidState``, ``RetryRefused``), 503 a stored payload the
    server cannot decode (its configuration, not the request), 400 every other client error
    (a bad id, payload or node; a ``QueryFailed``, as Temporal answers a failed query; an
    ``UpdateRejected`` or ``UpdateFailed``)."""
    if isinstance(exc, (ExecutionNotFound, RegistrationError, ScheduleNotFound, UnknownQuery, UnknownUpdate)):
        return 404
    if isinstance(exc, (ExecutionAlreadyExists, InvalidState, RetryRefused, ScheduleAlreadyExists)):
        return 409
    if isinstance(exc, (PayloadStoreError, PayloadCodecError)):
        return 503
    return 400  # PayloadNotSerializable, PayloadTooLarge, UnknownNode, InvalidExecutionId, ...


def error_body(exc: BaseException) -> dict[str, Any]:
    """The JSON body of an error response: ``{"error": <class name>, "detail": <message>}``,
    plus ``"reason"`` for a refused retry, ``"conflict"`` for an id already in use and ``"forks"``
    for an erasure refused while forks hold copies."""
    body: dict[str, Any] = {"error": type(exc).__name__, "detail": str(exc)}
    if isinstance(exc, RetryRefused):
        body["reason"] = exc.reason
    if isinstance(exc, ExecutionAlreadyExists):
        body["conflict"] = exc.conflict
    if isinstance(exc, ForksHoldCopies):
        body["forks"] = exc.forks
    return body


class CorruptHistory(HarvestError):
    """A stored history that cannot be replayed as it is: an event missing a field or holding
    one of the wrong type, or a history that does not start with ``WorkflowStarted``."""


class BodyInterrupted(HarvestError):
    """An activity body raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, a class of its own) outside a worker shutdown. The attempt's failure
    is recorded (and retried by its policy); Celery is handed this ordinary exception instead,
    because a ``BaseException`` escaping a task wedges Celery's thread pool."""

    def __init__(self, error_type: str, message: str = "") -> None:
        super().__init__(
            f"the activity body raised {error_type}"
            + (f": {message}" if message else "")
            + " (recorded as a failed attempt)"
        )
        self.error_type, self.error_message = error_type, message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.error_type, self.error_message))


class InvalidSchedule(HarvestError, ValueError):
    """A schedule argument harvest cannot take: the message names it. Nothing was written."""


class ScheduleNotFound(HarvestError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}")
        self.name = name


class ScheduleAlreadyExists(HarvestError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a schedule named {name!r} exists")
        self.name = name


class BeatImportRefused(HarvestError, ValueError):
    """``Harvest.import_beat`` refused entries, and wrote nothing: ``refused`` maps each entry's
    name to why (an unsupported schedule, option or name, a task not adopted, or a changed
    schedule without ``update=True``)."""

    def __init__(self, refused: dict[str, str]) -> None:
        lines = "".join(f"\n  {name!r}: {why}" for name, why in sorted(refused.items()))
        super().__init__(
            f"import-beat refused {len(refused)} entr{'y' if len(refused) == 1 else 'ies'} and wrote "
            f"nothing:{lines}"
        )
        self.refused = dict(refused)
