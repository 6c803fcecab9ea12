"""Replay stored histories against the current code before a deploy (``harvest replay``).

::

    from harvest_celery.replay import WorkflowReplayer

    report = WorkflowReplayer(harvest).replay_database(status="RUNNING", limit=1000)
    for line in report.lines():
        print(line)
    assert report.passed

A replay is a pure read: nothing is appended, no marker recorded, no counter incremented. See
docs/operations.md, "Pre-deploy check: harvest replay".
"""

from harvest_celery._replayer import RecordedRun, ReplayReport, RunReport, WorkflowReplayer, export_run

__all__ = ["RecordedRun", "ReplayReport", "RunReport", "WorkflowReplayer", "export_run"]
