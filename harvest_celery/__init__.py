"""harvest-celery: durable workflows, sagas and DAGs on the Celery you already run."""

from harvest_celery._client import Harvest, configure_celery
from harvest_celery._payloads.codec import FernetCodec, PayloadCodecError
from harvest_celery._core.context import WorkflowContext
from harvest_celery._dag.builder import (
    CollectAll,
    CompensatorNameCollidesWithNode,
    DagBuilder,
    DagBuildError,
    DagTaskFailed,
    FailFast,
    UnregisteredActivity,
    dag,
)
from harvest_celery._errors import (
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
from harvest_celery._payloads.stores import FileSystemPayloadStore, PayloadStoreError, PostgresPayloadStore
from harvest_celery._core.registry import activity, workflow
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._core.saga import Saga

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
