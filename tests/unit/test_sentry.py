"""Sentry on the embedded SQLite app, with the real ``sentry_sdk`` and a capturing transport
(docs/observability.md, "Sentry"): harvest never imports it, a workflow failure is reported
once with its file and line, replays and queries report nothing, and redaction holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from harvest_celery import Harvest, WorkflowContext, WorkflowFailed, activity, workflow
from harvest_celery._core.engine import replay_history
from harvest_celery._runtime import sentry

MARKER = "sentry-marker-4e0a"
WAIT = 30.0


class Capture(Transport):
    def __init__(self, options=None):
        super().__init__(options)
        self.events: list[dict] = []

    def capture_envelope(self, envelope):
        for item in envelope.items:
            if item.type in ("event", "error"):
                self.events.append(json.loads(item.payload.get_bytes()))


@activity
def noop(x):
    return x


@workflow
async def broken(ctx: WorkflowContext, order):
    await ctx.execute_activity(noop, 1)
    ctx.set_query_handler("q", lambda _arg: "ok")
    raise ValueError(f"bad order {order}")  # the line the report names


@pytest.fixture
def captured():
    transport = Capture()
    sentry_sdk.init(dsn="http://key@127.0.0.1:9/1", transport=transport, include_local_variables=False)
    try:
        yield transport
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # an inactive client again


def _app(tmp_path, **kw) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 's.db'}", **kw).register(noop, broken)
    h.migrate()
    return h


def _line_of(text: str) -> int:
    source = open(__file__).read().splitlines()
    return next(i + 1 for i, line in enumerate(source) if text in line)


def test_importing_harvest_does_not_import_sentry_sdk(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, harvest_celery
                harvest_celery.Harvest("sqlite:///{tmp_path / "i.db"}")
                print("sentry_sdk" in sys.modules, any(m.startswith("opentelemetry") for m in sys.modules))
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HARVEST_TRACING": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_no_sdk_or_an_inactive_one_is_none():
    assert sentry.sdk() is None or not sentry_sdk.get_client().is_active()


def test_a_workflow_failure_is_reported_once_with_its_file_and_line(tmp_path, captured):
    h = _app(tmp_path)
    run_id = h.start_workflow("broken", MARKER)
    with pytest.raises(WorkflowFailed):
        h.result(run_id, timeout=WAIT)
    replay_history(h.registry.workflow("broken"), run_id, h.history(run_id), h.registry)  # a probe
    h.query(run_id, "q")  # a query's replay
    sentry_sdk.flush()
    (event,) = captured.events
    assert event["tags"]["harvest.execution_id"] == run_id and event["tags"]["harvest.workflow"] == "broken"
    (exception,) = event["exception"]["values"]
    assert exception["type"] == "ValueError" and MARKER in exception["value"]  # "full": the message
    last = exception["stacktrace"]["frames"][-1]
    assert last["filename"] == __file__ and last["lineno"] == _line_of(
        'raise ValueError(f"bad order {order}")'
    )


def test_under_type_detail_the_report_holds_no_message(tmp_path, captured):
    h = _app(tmp_path, celery_error_detail="type")
    run_id = h.start_workflow("broken", MARKER)
    with pytest.raises(WorkflowFailed):
        h.result(run_id, timeout=WAIT)
    sentry_sdk.flush()
    (event,) = captured.events
    assert MARKER not in json.dumps(event)
    assert event["exception"]["values"][0]["type"] == "ValueError"


def test_without_an_active_client_nothing_is_recorded(tmp_path):
    h = _app(tmp_path)
    run_id = h.start_workflow("broken", 1)
    with pytest.raises(WorkflowFailed):
        h.result(run_id, timeout=WAIT)
    assert sentry.sdk() is None


def test_attempt_tags_and_an_explicit_capture(captured):
    with sentry_sdk.isolation_scope():
        sentry.tag_attempt("run-1", "charge", 2)
        sentry_sdk.capture_message("the integration's report")
    try:
        raise RuntimeError("eager failure")
    except RuntimeError as exc:
        sentry.capture_attempt("run-1", "charge", 3, exc, "run-1:4:3")
    sentry_sdk.capture_message("after: no attempt tags leak")
    sentry_sdk.flush()
    tagged, eager, after = captured.events
    assert tagged["tags"] == {
        "harvest.execution_id": "run-1",
        "harvest.activity": "charge",
        "harvest.attempt": "2",
    }
    assert (
        eager["tags"]["harvest.attempt"] == "3" and eager["exception"]["values"][0]["type"] == "RuntimeError"
    )
    assert eager["tags"]["celery_task_id"] == "run-1:4:3"  # as Sentry's integration tags a task
    assert eager["extra"]["celery-job"] == {
        "task_name": "charge",
        "args": "[Filtered]",
        "kwargs": "[Filtered]",
    }
    assert "harvest.attempt" not in after.get("tags", {})
