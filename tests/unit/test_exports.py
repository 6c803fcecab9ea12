"""The public surface is a contract (DESIGN.md, "Public Python surface"): pin it."""

import harvest_celery

CONTRACT = {
    "Harvest",
    "activity",
    "workflow",
    "dag",
    "WorkflowContext",
    "Saga",
    "DagBuilder",
    "RetryPolicy",
    "CollectAll",
    "FailFast",
    "HarvestError",
    "Cancelled",
    "NonDeterministic",
    "SagaCompensationFailed",
    "PayloadTooLarge",
}


def test_the_design_contract_names_are_exported():
    assert CONTRACT <= set(harvest_celery.__all__)
    for name in harvest_celery.__all__:
        assert getattr(harvest_celery, name) is not None


def test_the_exported_list_is_exactly_this():
    assert sorted(harvest_celery.__all__) == sorted(
        [
            "ActivityContext",
            "ActivityError",
            "BeatImportRefused",
            "BodyInterrupted",
            "AsyncHarvest",
            "Cancelled",
            "CanvasNotSupported",
            "ChildWorkflowFailed",
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
            "ForksHoldCopies",
            "FernetCodec",
            "FileSystemPayloadStore",
            "Harvest",
            "HarvestError",
            "InvalidExecutionId",
            "InvalidLimitKey",
            "InvalidSchedule",
            "InvalidState",
            "InvalidTaskCall",
            "NonDeterministic",
            "NotInActivity",
            "NotInWorkflow",
            "PayloadCodecError",
            "PayloadNotSerializable",
            "PayloadStore",
            "PayloadStoreError",
            "PayloadTooLarge",
            "PostgresPayloadStore",
            "QueryFailed",
            "RedactedActivityError",
            "RegistrationError",
            "RetryPolicy",
            "RetryRefused",
            "StartToCloseTimeout",
            "Timings",
            "UnknownEventType",
            "UnknownNode",
            "UnknownQuery",
            "UnknownUpdate",
            "Saga",
            "SagaCompensationFailed",
            "ScheduleAlreadyExists",
            "ScheduleNotFound",
            "UnknownActivity",
            "UnknownWorkflow",
            "UnregisteredActivity",
            "UpdateFailed",
            "UpdateRejected",
            "WorkflowCancelledError",
            "WorkflowContext",
            "WorkflowFailed",
            "WorkflowTimedOut",
            "activity",
            "activity_context",
            "configure_celery",
            "configure_dedicated_celery_app",
            "dag",
            "workflow",
        ]
    )


def test_the_exported_list_is_sorted():
    assert harvest_celery.__all__ == sorted(harvest_celery.__all__)


def test_every_error_is_a_harvest_error():
    for name in harvest_celery.__all__:
        obj = getattr(harvest_celery, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, harvest_celery.HarvestError), name


def test_every_error_in_the_tree_is_exported():
    from harvest_celery import _errors

    tree = {
        name
        for name, obj in vars(_errors).items()
        if isinstance(obj, type) and issubclass(obj, _errors.HarvestError)
    }
    assert tree <= set(harvest_celery.__all__)
