"""harvest joins an existing Celery app as a good citizen: the app's own tasks and settings are
untouched, a failed attempt is a Celery FAILURE with its real exception and traceback (so
task_failure fires for error trackers), and a refused claim is IGNORED, never SUCCESS."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from harvest_celery import WorkflowFailed

from .conftest import Worker, wait_for


@pytest.fixture(scope="module")
def shop(harvest: Any, redis_client: Any) -> Any:
    from tests.integration import shop_app

    redis_client.delete(shop_app.SEEN)
    worker = Worker("shop", "celery,shop_q,shop_decide", app="tests.integration.shop_app")
    worker.start()
    try:
        yield shop_app
    finally:
        worker.stop()


def seen(redis_client: Any, **match: Any) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in redis_client.lrange("shop:seen", 0, -1)]
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def test_joining_changes_nothing_of_the_apps_own_config(shop):
    changed = {
        k: (v, shop.AFTER_HARVEST.get(k))
        for k, v in shop.BEFORE_HARVEST.items()
        if shop.AFTER_HARVEST.get(k) != v
    }
    assert changed == {}
    assert set(shop.AFTER_HARVEST) == set(shop.BEFORE_HARVEST)


def test_the_apps_own_task_still_returns_its_result_on_its_own_default_queue(shop, redis_client):
    result = shop.add.delay(2, 3)
    assert result.get(timeout=20) == 5
    rows = wait_for(lambda: seen(redis_client, task_id=result.id, signal="postrun"), what="postrun")
    assert rows[0]["queue"] == "celery" and rows[0]["state"] == "SUCCESS"


def test_a_failed_attempt_is_a_celery_failure_with_its_real_exception(shop, redis_client):
    rid = shop.harvest.start_workflow("shop_checkout", {"tag": "f1"})
    with pytest.raises(WorkflowFailed, match="card declined"):
        shop.harvest.result(rid, timeout=30)
    for attempt in (1, 2):  # the engine's own retry policy ran both attempts
        task_id = f"{rid}:2:{attempt}"
        post = wait_for(lambda t=task_id: seen(redis_client, task_id=t, signal="postrun"), what=task_id)
        assert post[0]["state"] == "FAILURE" and post[0]["name"] == "shop_declines"
        failure = seen(redis_client, task_id=task_id, signal="failure")
        assert (
            failure and "ValueError" in failure[0]["exception"] and "card declined" in failure[0]["exception"]
        )
        assert "shop_declines" in failure[0]["traceback"]  # the body's own frame
    ok = seen(redis_client, task_id=f"{rid}:1:1", signal="postrun")
    assert ok and ok[0]["state"] == "SUCCESS"


def test_a_refused_claim_is_ignored_never_success(shop, redis_client):
    rid = shop.harvest.start_workflow("shop_checkout", {"tag": "dup"})
    with pytest.raises(WorkflowFailed):
        shop.harvest.result(rid, timeout=30)
    # a duplicate delivery of an attempt that already ran: the claim refuses it
    shop.app.send_task("shop_ok", args=[rid, "1", 1], queue="shop_q", task_id=f"dup-{rid}")
    post = wait_for(lambda: seen(redis_client, task_id=f"dup-{rid}", signal="postrun"), what="postrun")
    assert post[0]["state"] == "IGNORED"
    assert not seen(redis_client, task_id=f"dup-{rid}", signal="failure")


def test_every_attempts_error_is_kept_with_its_traceback(shop):
    rid = shop.harvest.start_workflow("shop_checkout", {"tag": "tb"})
    with pytest.raises(WorkflowFailed):
        shop.harvest.result(rid, timeout=30)
    errors = shop.harvest.store.attempt_errors(rid)
    attempts = [(e.activity_id, e.attempt, e.error_type) for e in errors]
    assert attempts == [("2", 1, "ValueError"), ("2", 2, "ValueError"), ("", 0, "ActivityError")]
    for e in errors[:2]:
        assert e.message == "card declined for tb"
        assert "in shop_declines" in e.traceback and 'raise ValueError(f"card declined' in e.traceback
    # the workflow's own failure: the traceback of the workflow code, with file and line
    assert "shop_app.py" in errors[2].traceback and "in shop_checkout" in errors[2].traceback
    # the history is unchanged: one ActivityFailed for the awaited result, no new event type
    types = [h.event.type for h in shop.harvest.history(rid)]
    assert types.count("ActivityFailed") == 1 and "WorkflowFailed" in types


def test_harvest_show_and_the_api_show_every_attempts_error(shop, capsys):
    from fastapi.testclient import TestClient

    from harvest_celery._cli import main
    from harvest_celery._web.app import create_app

    rid = shop.harvest.start_workflow("shop_checkout", {"tag": "show"})
    with pytest.raises(WorkflowFailed):
        shop.harvest.result(rid, timeout=30)
    assert main(["--database-url", shop.DATABASE_URL, "show", rid]) == 0
    out = capsys.readouterr().out
    assert "errors (every attempt):" in out
    assert "activity #2 attempt 1: ValueError: card declined for show" in out
    assert "activity #2 attempt 2: ValueError: card declined for show" in out
    assert "in shop_declines" in out
    client = TestClient(create_app(shop.harvest, token="t0ken"))
    assert client.get(f"/workflows/{rid}/errors").status_code == 401  # reads need the token too
    body = client.get(f"/workflows/{rid}/errors", headers={"Authorization": "Bearer t0ken"}).json()
    assert [(e["activity_id"], e["attempt"]) for e in body["errors"]] == [("2", 1), ("2", 2), ("", 0)]
    assert "shop_declines" in body["errors"][0]["traceback"]


@pytest.mark.parametrize("succeed_on", [3, 9])
def test_an_adopted_tasks_autoretry_for_becomes_engine_retries(shop, redis_client, succeed_on):
    """``shop.flaky_charge`` has Celery's ``autoretry_for=(ConnectionError,)``, ``max_retries=5``;
    adopted with ``RetryPolicy(max_attempts=3)``, each failure is an engine attempt (recorded, with
    its error), never a Celery retry message. It succeeds on its 3rd call, or fails for good after
    the engine's 3 attempts (not Celery's 6)."""
    tag = uuid.uuid4().hex[:12]
    rid = shop.harvest.start_workflow("shop_adopted", {"tag": tag, "succeed_on": succeed_on})
    if succeed_on == 3:
        assert shop.harvest.result(rid, timeout=30) == "charged after 3"
    else:
        with pytest.raises(WorkflowFailed, match="ConnectionError: gateway timeout on call 3"):
            shop.harvest.result(rid, timeout=30)
    assert int(redis_client.get(f"shop:charge:{tag}")) == 3  # the body ran once per engine attempt
    history = [h.event for h in shop.harvest.history(rid)]
    assert [e.attempt for e in history if e.type == "ActivityStarted"] == [1, 2, 3]
    assert [e.type for e in history][-2:] == (
        ["ActivityCompleted", "WorkflowCompleted"]
        if succeed_on == 3
        else ["ActivityFailed", "WorkflowFailed"]
    )
    failed = 2 if succeed_on == 3 else 3
    errors = [
        (e.activity_id, e.attempt, e.error_type, e.message)
        for e in shop.harvest.store.attempt_errors(rid)
        if e.activity_id
    ]
    assert errors == [
        ("1", n, "ConnectionError", f"gateway timeout on call {n}") for n in range(1, failed + 1)
    ]
    for attempt in (1, 2, 3):  # one Celery task per engine attempt, each ending as it really did
        task_id = f"{rid}:1:{attempt}"
        post = wait_for(lambda t=task_id: seen(redis_client, task_id=t, signal="postrun"), what=task_id)
        assert [p["state"] for p in post] == ["FAILURE" if attempt <= failed else "SUCCESS"]
    assert not [
        r
        for r in seen(redis_client, signal="retry", name="shop.flaky_charge")
        if str(r["task_id"]).startswith(rid)
    ]  # Celery never retried it itself
