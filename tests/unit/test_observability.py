"""Observability without services (issue 29, items 6-8): a run line's structured fields, the
JSON log format and its switch, the new metrics and the limit gauges, and the eager attempt as
Celery code sees it (``celery_compat``), on SQLite in embedded mode and an in-memory Celery app."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, current_task, signals
from prometheus_client import REGISTRY

from harvest_celery import Harvest, RetryPolicy, WorkflowContext, activity, workflow
from harvest_celery._runtime import celery as celery_runtime
from harvest_celery._runtime import claim as claims
from harvest_celery._runtime import logs
from harvest_celery._runtime.celery_compat import EAGER_MARK, EagerAttempt, is_eager
from harvest_celery._runtime.messages import encode
from harvest_celery._runtime.metrics import METRICS, exposition
from harvest_celery._store.records import Claim, Dispatch

ROOT = Path(__file__).resolve().parents[2]


@activity(name="ob_step", queue="ob_q")
def ob_step(x: int) -> int:
    return x + 1


_FLAKY: dict[str, int] = {}


@activity(name="ob_flaky", queue="ob_q", retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
def ob_flaky(key: str) -> str:
    _FLAKY[key] = _FLAKY.get(key, 0) + 1
    if _FLAKY[key] == 1:
        raise ValueError("the first attempt fails")
    return key


@activity(name="ob_limited", queue="ob_q", concurrency=2)
def ob_limited(x: int) -> int:
    return x


@workflow(name="ob_flow")
async def ob_flow(ctx: WorkflowContext, n: int) -> int:
    for _ in range(n):
        n = await ctx.execute_activity(ob_step, n)
    return n


@workflow(name="ob_retry_flow")
async def ob_retry_flow(ctx: WorkflowContext, key: str) -> str:
    return await ctx.execute_activity(ob_flaky, key)  # type: ignore[no-any-return]


@workflow(name="ob_limited_flow")
async def ob_limited_flow(ctx: WorkflowContext, x: int) -> int:
    return await ctx.execute_activity(ob_limited, x)  # type: ignore[no-any-return]


def embedded(tmp_path: Any, **kwargs: Any) -> Harvest:
    h = Harvest(f"sqlite:///{tmp_path / 'ob.db'}", **kwargs).register(
        ob_step, ob_flaky, ob_limited, ob_flow, ob_retry_flow, ob_limited_flow
    )
    h.migrate()
    return h


# ── a run line's fields ──────────────────────────────────────────────────────────────────────
def test_run_fields_leave_out_what_does_not_apply() -> None:
    assert logs.run("r1") == {"execution_id": "r1"}
    assert logs.run("r1", "charge", "3", 2) == {
        "execution_id": "r1",
        "activity": "charge",
        "activity_id": "3",
        "attempt": 2,
    }
    claim = Claim("r1", "3", "charge", 2, {"card": "x"}, None)
    assert logs.of_claim(claim) == logs.run("r1", "charge", "3", 2)  # never the input


def test_a_messages_fields_name_its_run_and_attempt() -> None:
    decide = encode(Dispatch(Dispatch.DECIDE, "r1", "harvest"))
    assert logs.of_message(decide) == {"execution_id": "r1"}
    native = encode(Dispatch(Dispatch.ACTIVITY, "r1", "q", "3", "charge", 2))
    assert logs.of_message(native) == logs.run("r1", "charge", "3", 2)
    adopted = encode(Dispatch(Dispatch.ACTIVITY, "r1", "q", "3", "legacy", 1, adopted=True, input={"a": 1}))
    assert logs.of_message(adopted) == logs.run("r1", "legacy", "3", 1)  # from its header, not its input


def test_every_harvest_line_about_a_run_carries_its_execution_id(tmp_path, caplog) -> None:
    h = embedded(tmp_path)
    caplog.set_level(logging.DEBUG, logger="harvest_celery")
    rid = h.start_workflow("ob_flow", 2)
    assert h.result(rid, timeout=10) == 4
    assert claims.claim(h.runtime, rid, "1", 1) is None  # a duplicate: refused, at INFO
    about = [r for r in caplog.records if r.name.startswith("harvest_celery") and rid in r.getMessage()]
    assert about, "no harvest line about the run was logged"
    for record in about:
        assert getattr(record, "execution_id", None) == rid, record.getMessage()
    refused = next(r for r in about if "refused" in r.getMessage())
    assert (refused.activity_id, refused.attempt) == ("1", 1)  # type: ignore[attr-defined]


def test_a_process_wide_line_carries_no_run(tmp_path, caplog, monkeypatch) -> None:
    h = embedded(tmp_path)
    caplog.set_level(logging.INFO, logger="harvest_celery")

    def gone() -> Any:
        raise OSError("database gone")

    monkeypatch.setattr(h.runtime.store, "begin", gone)
    h.runtime.sync_limits()  # a worker start's line: about no run
    record = next(r for r in caplog.records if "cannot sync the declared activity limits" in r.getMessage())
    assert not any(hasattr(record, name) for name in logs.FIELDS)


# ── the JSON format ──────────────────────────────────────────────────────────────────────────
def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


_JSON_APP = """
    import logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="ROOT %(levelname)s %(name)s: %(message)s")
    from harvest_celery import Harvest
    from harvest_celery._runtime import logs
    h = {make}
    logging.getLogger("myshop").info("an application line")
    logging.getLogger("harvest_celery").info("claim of r1/3 refused", extra=logs.run("r1", "charge", "3", 2))
    logging.getLogger("harvest_celery.api").warning("healthz: no database")
    class Diag:
        message_primary = "invalid input syntax for type json"
    class DriverError(Exception):
        diag = Diag()
    try:
        try:
            raise DriverError("LINE 1: ... 'card=4111-SECRET' ...")
        except DriverError as exc:
            raise RuntimeError("the write failed") from exc
    except RuntimeError:
        logging.getLogger("harvest_celery").exception("recording failed", extra=logs.run("r1"))
    print("root format unchanged:", logging.getLogger().handlers[0].formatter._fmt)
"""


@pytest.mark.parametrize(
    ("make", "env"),
    [
        ('Harvest("sqlite://", log_format="json")', {}),
        ("Harvest.from_env()", {"HARVEST_LOG_FORMAT": "json"}),
    ],
    ids=["keyword", "environment"],
)
def test_json_switches_harvests_loggers_only(make: str, env: dict[str, str]) -> None:
    done = _python(_JSON_APP.format(make=make), **env)
    lines = done.stderr.splitlines()
    ours = [json.loads(x) for x in lines if x.startswith("{")]
    rest = [x for x in lines if not x.startswith("{")]
    assert "ROOT INFO myshop: an application line" in rest  # the application's logging unchanged
    assert "root format unchanged: ROOT %(levelname)s %(name)s: %(message)s" in done.stdout
    assert not [x for x in rest if "harvest_celery" in x and x.startswith("ROOT")]  # written once
    by_message = {x["message"]: x for x in ours}
    claim = by_message["claim of r1/3 refused"]
    assert claim["logger"] == "harvest_celery" and claim["level"] == "INFO"
    assert (claim["execution_id"], claim["activity"], claim["activity_id"], claim["attempt"]) == (
        "r1",
        "charge",
        "3",
        2,
    )
    assert by_message["healthz: no database"]["logger"] == "harvest_celery.api"
    assert "execution_id" not in by_message["healthz: no database"]
    failed = by_message["recording failed"]
    assert failed["execution_id"] == "r1"
    # the redaction filter ran before the JSON formatter: no value of the statement leaves
    assert "RedactedDatabaseError" in failed["exception"] and "invalid input syntax" in failed["exception"]
    assert "SECRET" not in done.stderr


def test_text_leaves_harvests_loggers_as_they_are() -> None:
    done = _python(
        """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="ROOT %(name)s: %(message)s")
        from harvest_celery import Harvest
        Harvest("sqlite://", log_format="text")
        logging.getLogger("harvest_celery").info("a line")
        print(logging.getLogger("harvest_celery").propagate, len(logging.getLogger("harvest_celery").handlers))
        """
    )
    assert "ROOT harvest_celery: a line" in done.stderr.splitlines()
    assert done.stdout.strip() == "True 0"


def test_the_json_switch_is_idempotent() -> None:
    done = _python(
        """
        import logging
        from harvest_celery import Harvest
        Harvest("sqlite://", log_format="json")
        Harvest("sqlite://", log_format="json")
        print([len(logging.getLogger(n).handlers) for n in ("harvest_celery", "harvest_celery.api")])
        """
    )
    assert done.stdout.strip() == "[1, 1]"


def test_a_bad_log_format_is_refused_before_anything_is_made(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    with pytest.raises(
        ValueError, match=r"Harvest\(log_format='xml'\): log_format accepts \"text\" or \"json\""
    ):
        Harvest(url, log_format="xml")  # type: ignore[arg-type]
    monkeypatch.setenv("HARVEST_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match=r"HARVEST_LOG_FORMAT='yaml': log_format accepts"):
        Harvest(url)
    assert not (tmp_path / "never.db").exists()
    assert not any(isinstance(h, logs._JsonHandler) for h in logging.getLogger("harvest_celery").handlers)
    with pytest.raises(ValueError, match="log_format accepts"):
        logs.configure("xml")


# ── metrics ──────────────────────────────────────────────────────────────────────────────────
def _lag_count(queue: str) -> float:
    return (
        REGISTRY.get_sample_value("harvest_activity_schedule_to_start_seconds_count", {"queue": queue}) or 0.0
    )


def test_steps_and_first_attempts_lag_are_counted_after_commit(tmp_path) -> None:
    h = embedded(tmp_path)
    steps = METRICS.value("activity_completed", {"workflow": "ob_flow", "queue": "ob_q"})
    lagged = _lag_count("ob_q")
    rid = h.start_workflow("ob_flow", 3)
    assert h.result(rid, timeout=10) == 6
    assert METRICS.value("activity_completed", {"workflow": "ob_flow", "queue": "ob_q"}) - steps == 3
    assert _lag_count("ob_q") - lagged == 3


def test_a_retry_is_one_step_and_one_lag_sample(tmp_path) -> None:
    h = embedded(tmp_path)
    steps = METRICS.value("activity_completed", {"workflow": "ob_retry_flow", "queue": "ob_q"})
    lagged = _lag_count("ob_q")
    failed = METRICS.value("activity_attempt_failed", {"workflow": "ob_retry_flow", "queue": "ob_q"})
    rid = h.start_workflow("ob_retry_flow", f"k-{tmp_path.name}")
    assert h.result(rid, timeout=10) == f"k-{tmp_path.name}"
    assert (
        METRICS.value("activity_attempt_failed", {"workflow": "ob_retry_flow", "queue": "ob_q"}) - failed == 1
    )
    assert METRICS.value("activity_completed", {"workflow": "ob_retry_flow", "queue": "ob_q"}) - steps == 1
    assert _lag_count("ob_q") - lagged == 1  # the second attempt waited on its backoff: not lag


def test_a_claim_carries_its_queue_and_when_it_was_scheduled(tmp_path) -> None:
    h = embedded(tmp_path)
    h.runtime.dispatcher = None  # nothing is sent, so nothing runs by itself
    rid = h.start_workflow("ob_flow", 1)
    h.runtime.run_decision(rid)  # schedules the first step
    scheduled = next(e for e in h.history(rid) if e.event.type == "ActivityScheduled")
    claimed = h.runtime.claim(rid, scheduled.event.activity_id, 1)
    assert claimed is not None
    assert claimed.queue == "ob_q"
    assert claimed.scheduled_at == scheduled.recorded_at
    assert claimed.started_at is not None and claimed.scheduled_at <= claimed.started_at


def test_limit_gauges_are_read_from_the_store_when_scraped(tmp_path) -> None:
    h = embedded(tmp_path)
    rid = h.start_workflow("ob_limited_flow", 5)
    assert h.result(rid, timeout=10) == 5
    text = exposition()[0].decode()
    assert 'harvest_limit_in_use{limit="ob_limited"} 0.0' in text
    assert 'harvest_limit_waiting{limit="ob_limited"} 0.0' in text


def test_a_held_back_dispatch_shows_in_the_waiting_gauge(tmp_path) -> None:
    h = embedded(tmp_path)
    h.runtime.sync_limits()  # the worker start's declaration, so the limit can be overridden
    h.set_limit("ob_limited", concurrency=0)  # every new slot held
    rid = h.start_workflow("ob_limited_flow", 7)
    assert h.describe(rid).status == "RUNNING"
    text = exposition()[0].decode()
    assert 'harvest_limit_waiting{limit="ob_limited"} 1.0' in text
    assert 'harvest_limit_in_use{limit="ob_limited"} 0.0' in text
    h.set_limit("ob_limited", concurrency=1)  # the raised limit releases it
    assert 'harvest_limit_waiting{limit="ob_limited"} 0.0' in exposition()[0].decode()


def test_limit_gauges_of_a_database_that_does_not_answer_are_empty(caplog) -> None:
    saved = METRICS.limits.source

    def gone() -> list[dict[str, Any]]:
        raise OSError("no database")

    METRICS.limits.source = gone
    try:
        text = exposition()[0].decode()
    finally:
        METRICS.limits.source = saved
    assert "# TYPE harvest_limit_waiting gauge" in text and "harvest_limit_waiting{" not in text
    assert "harvest_decisions_total" in text or "harvest_decisions" in text  # the scrape still answers
    assert any("cannot read the limits (OSError)" in r.getMessage() for r in caplog.records)


# ── the eager attempt as Celery code sees it ────────────────────────────────────────────────
@pytest.fixture
def celery_harvest(tmp_path) -> Iterator[Harvest]:
    app = Celery("ob_eager", broker="memory://", set_as_current=False)
    h = Harvest(f"sqlite:///{tmp_path / 'e.db'}", app).register(ob_step, ob_flow)
    h.migrate()
    yield h


def _raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - a body's error has its traceback
        return caught


def _dispatch(execution_id: str = "r1") -> Dispatch:
    return Dispatch(Dispatch.ACTIVITY, execution_id, "ob_q", "1", "ob_step", 1)


def test_an_eager_attempt_is_the_current_task_through_its_signals(celery_harvest: Harvest) -> None:
    seen: list[tuple[str, Any, Any, bool, str | None]] = []

    def listener(name: str) -> Any:
        def on(sender: Any = None, task_id: str = "", state: str | None = None, **_kw: Any) -> None:
            if getattr(sender, "name", None) == "ob_step":
                request = current_task.request
                seen.append((name, task_id, request.id, is_eager(request), state))

        return on

    handlers = {
        sig: listener(name)
        for name, sig in (
            ("prerun", signals.task_prerun),
            ("failure", signals.task_failure),
            ("postrun", signals.task_postrun),
        )
    }
    for sig, handler in handlers.items():
        sig.connect(handler, weak=False)
    try:
        with EagerAttempt(celery_harvest.celery_app, _dispatch(), "r1:1:1", ["r1", "1", 1], "w@h") as attempt:
            assert current_task.request.id == "r1:1:1" and current_task.request.delivery_info[EAGER_MARK]
            attempt.prerun()
            shown = attempt.outcome(celery_harvest.runtime, True, _raised(ValueError("x")))
        assert not current_task  # popped: no task is current once it ends
    finally:
        for sig, handler in handlers.items():
            sig.disconnect(handler)
    assert isinstance(shown, ValueError)
    assert seen == [
        ("prerun", "r1:1:1", "r1:1:1", True, None),
        ("failure", "r1:1:1", "r1:1:1", True, None),
        ("postrun", "r1:1:1", "r1:1:1", True, "FAILURE"),
    ]


def test_a_refused_eager_claim_ends_ignored(celery_harvest: Harvest) -> None:
    states: list[str] = []

    def on(sender: Any = None, state: str = "", **_kw: Any) -> None:
        states.append(state)

    signals.task_postrun.connect(on, weak=False)
    try:
        with EagerAttempt(celery_harvest.celery_app, _dispatch(), "r1:1:1", ["r1", "1", 1], None) as attempt:
            assert attempt.outcome(celery_harvest.runtime, False, None) is None
    finally:
        signals.task_postrun.disconnect(on)
    assert states == ["IGNORED"]


def test_harvests_prerun_hook_never_claims_an_eager_attempt_twice(
    celery_harvest: Harvest, monkeypatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(celery_harvest.runtime, "claim", lambda *a: calls.append(a))
    task = celery_harvest.celery_app.tasks["ob_step"]
    with EagerAttempt(celery_harvest.celery_app, _dispatch(), "r1:1:1", ["r1", "1", 1], None) as attempt:
        attempt.prerun()  # harvest's own _on_prerun is connected (install) and skips it
        assert not hasattr(task.request, "harvest_claim")
    assert calls == []
    task.push_request(id="r1:1:1", args=["r1", "1", 1], delivery_info={"routing_key": "ob_q"})
    try:  # a delivered request of the same attempt is claimed by the hook
        celery_runtime._on_prerun(sender=task, task=task, args=["r1", "1", 1])
        assert calls == [("r1", "1", 1)]
    finally:
        task.pop_request()


def test_an_activity_unknown_to_the_celery_app_sees_nothing(celery_harvest: Harvest) -> None:
    d = Dispatch(Dispatch.ACTIVITY, "r1", "ob_q", "1", "not_a_task", 1)
    with EagerAttempt(celery_harvest.celery_app, d, "r1:1:1", ["r1", "1", 1], None) as attempt:
        attempt.prerun()
        assert attempt.outcome(celery_harvest.runtime, True, ValueError("x")) is None
