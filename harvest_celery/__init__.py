"""harvest-celery: durable workflows, sagas and DAGs on the Celery you already run."""

from harvest_celery._client import Harvest, configure_celery, configure_dedicated_celery_app
from harvest_celery._client_async import AsyncHarvest
from harvest_celery._core.context import WorkflowContext
from harvest_celery._core.registry import activity, workflow
from harvest_celery._core.retry import RetryPolicy
from harvest_celery._core.saga import Saga
from harvest_celery._dag.builder import DagBuilder, dag
from harvest_celery._dag.model import CollectAll, FailFast
from harvest_celery._errors import (
    ActivityError,
    BodyInterrupted,
    Cancelled,
    CompensatorNameCollidesWithNode,
    CorruptHistory,
    DagBuildError,
    DagTaskFailed,
    DuplicateRegistration,
    ExecutionAlreadyExists,
    ExecutionNotFound,
    ForksHoldCopies,
    HarvestError,
    InvalidExecutionId,
    InvalidLimitKey,
    InvalidState,
    NonDeterministic,
    NotInActivity,
    NotInWorkflow,
    PayloadCodecError,
    PayloadNotSerializable,
    PayloadStoreError,
    PayloadTooLarge,
    RedactedActivityError,
    RegistrationError,
    RetryRefused,
    SagaCompensationFailed,
    StartToCloseTimeout,
    UnknownActivity,
    UnknownEventType,
    UnknownNode,
    UnknownWorkflow,
    UnregisteredActivity,
    WorkflowCancelledError,
    WorkflowFailed,
)
from harvest_celery._payloads.codec import Codec, FernetCodec
from harvest_celery._payloads.stores import FileSystemPayloadStore, PayloadStore
from harvest_celery._runtime.activity_context import ActivityContext, activity_context
from harvest_celery._store.blobs import PostgresPayloadStore
from harvest_celery._store.records import Timings

__version__ = "0.1.0"

__all__ = [
    "ActivityContext",
    "ActivityError",
    "AsyncHarvest",
    "BodyInterrupted",
    "Cancelled",
    "Codec",
    "CollectAll",
    "CompensatorNameCollidesWithNode",
    "CorruptHistory",
    "DagBuildError",
    "DagBuilder",
    "DagTaskFailed",
    "DuplicateRegistration",
    "ExecutionAlreadyExists",
    "ExecutionNotFound",
    "FailFast",
    "FernetCodec",
    "FileSystemPayloadStore",
    "ForksHoldCopies",
    "Harvest",
    "HarvestError",
    "InvalidExecutionId",
    "InvalidLimitKey",
    "InvalidState",
    "NonDeterministic",
    "NotInActivity",
    "NotInWorkflow",
    "PayloadCodecError",
    "PayloadNotSerializable",
    "PayloadStore",
    "PayloadStoreError",
    "PayloadTooLarge",
    "PostgresPayloadStore",
    "RedactedActivityError",
    "RegistrationError",
    "RetryPolicy",
    "RetryRefused",
    "Saga",
    "SagaCompensationFailed",
    "StartToCloseTimeout",
    "Timings",
    "UnknownActivity",
    "UnknownEventType",
    "UnknownNode",
    "UnknownWorkflow",
    "UnregisteredActivity",
    "WorkflowCancelledError",
    "WorkflowContext",
    "WorkflowFailed",
    "activity",
    "activity_context",
    "configure_celery",
    "configure_dedicated_celery_app",
    "dag",
    "workflow",
]
