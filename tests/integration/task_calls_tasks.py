"""A user's existing Celery tasks, as they are before harvest joins: plain ``@app.task``
functions of every shape, on an app with Celery's json serializer. Nothing of harvest is
imported here (``task_calls_app`` adopts them). They note their calls in Redis so a test can see
what each body received, how often and when."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")

app = Celery("task_calls", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"], result_expires=600)
_r = redis.Redis.from_url(BROKER_URL)


def _note(tag: str, **what: Any) -> int:
    """Record one call of a body under ``tag``; returns how many calls it has had."""
    return int(_r.rpush(f"tc:{tag}", json.dumps({"at": time.time(), **what})))


@app.task(name="tc.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="tc.scale")
def scale(x: Any, *, factor: int = 2) -> Any:
    return x * factor


@app.task(name="tc.spread")
def spread(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": args, "kwargs": kwargs}


@app.task(name="tc.bound", bind=True)
def bound(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """What Celery's own request shows of the call (the message's args and kwargs)."""
    return {"args": self.request.args, "kwargs": self.request.kwargs}


@app.task(name="tc.flaky", autoretry_for=(ConnectionError,), max_retries=5, default_retry_delay=0)
def flaky(tag: str, amount: int, *, succeed_on: int) -> str:
    calls = _note(tag, args=[tag, amount], kwargs={"succeed_on": succeed_on})
    if calls < succeed_on:
        raise ConnectionError(f"gateway timeout on call {calls}")
    return f"charged {amount} after {calls}"


@app.task(name="tc.stuck_once")
def stuck_once(tag: str, items: list[Any], *, note: str) -> dict[str, Any]:
    """Its first call never returns (the test kills its worker); a later one returns."""
    calls = _note(tag, args=[tag, items], kwargs={"note": note})
    if calls == 1:
        time.sleep(600)
    return {"items": items, "note": note, "calls": calls}


@app.task(name="tc.noted")
def noted(tag: str, value: Any) -> Any:
    _note(tag, args=[tag, value])
    return value
