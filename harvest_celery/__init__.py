"""harvest-celery: durable workflows, sagas and DAGs on the Celery you already run."""

from ._client import Harvest, configure_celery
from ._codec import FernetCodec, PayloadCodecError
from ._context import WorkflowContext
from ._dag import (
    CollectAll,
    CompensatorNameCollidesWithNode,
    DagBuilder,
    DagBuildError,
    DagTaskFailed,
    FailFast,
    UnregisteredActivity,
    dag,
)
from ._errors import (
    ActivityError,
    Cancelled,
    DuplicateRegistration,
    ExecutionAlreadyExists,
    ExecutionNotFound,
    HarvestError,
    InvalidState,
    NonDeterministic,
    NotInWorkflow,
    PayloadNotSerializable,
    PayloadTooLarge,
    RegistrationError,
    SagaCompensationFailed,
    UnknownActivity,
    UnknownWorkflow,
    WorkflowCancelledError,
    WorkflowFailed,
)
from ._payload_store import FileSystemPayloadStore, PayloadStoreError, PostgresPayloadStore
from ._registry import activity, workflow
from ._retry import RetryPolicy
from ._saga import Saga

__version__ = "0.1.0"

__all__ = [
    "ActivityError",
    "Cancelled",
    "CollectAll",
    "CompensatorNameCollidesWithNode",
    "DagBuildError",
    "DagBuilder",
    "DagTaskFailed",
    "DuplicateRegistration",
    "ExecutionAlreadyExists",
    "ExecutionNotFound",
    "FernetCodec",
    "FileSystemPayloadStore",
    "FailFast",
    "Harvest",
    "HarvestError",
    "InvalidState",
    "NonDeterministic",
    "NotInWorkflow",
    "PayloadCodecError",
    "PayloadNotSerializable",
    "PayloadStoreError",
    "PayloadTooLarge",
    "PostgresPayloadStore",
    "RegistrationError",
    "RetryPolicy",
    "Saga",
    "SagaCompensationFailed",
    "UnknownActivity",
    "UnknownWorkflow",
    "UnregisteredActivity",
    "WorkflowCancelledError",
    "WorkflowContext",
    "WorkflowFailed",
    "activity",
    "configure_celery",
    "dag",
    "workflow",
]
