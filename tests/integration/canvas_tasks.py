"""A user's existing Celery tasks, as they are before harvest joins: plain ``@app.task``
functions on an app with Celery's json serializer and a Redis result backend (so the same
canvases run under plain Celery in the same test). Nothing of harvest is imported here
(``canvas_app`` adopts them). Tasks that do something note it in a Redis list per tag, so a test
sees what ran, with what, and in which order."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

BROKER_URL = os.environ.get("HARVEST_TEST_BROKER_URL", "redis://127.0.0.1:6379/5")
BACKEND_URL = os.environ.get("HARVEST_TEST_REDIS_URL", BROKER_URL)
# this run's own queue (HARVEST_TEST_CV_SUFFIX, set by the module's fixture before the import)
QUEUE = f"cv_q{os.environ.get('HARVEST_TEST_CV_SUFFIX', '')}"

app = Celery("canvas_tasks", broker=BROKER_URL, backend=BACKEND_URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=600,
    task_default_queue=QUEUE,  # plain Celery's messages go where this module's worker listens
)
_r = redis.Redis.from_url(BACKEND_URL)


def note(tag: str, what: str, value: Any) -> None:
    _r.rpush(f"cv:{tag}", json.dumps({"what": what, "value": value, "at": time.time()}))


@app.task(name="cv.add")
def add(x: int, y: int = 0, *, z: int = 0) -> int:
    return x + y + z


@app.task(name="cv.tsum")
def tsum(xs: list[int], *, scale: int = 1) -> int:
    return sum(xs) * scale


@app.task(name="cv.pair")
def pair(x: Any, y: Any) -> tuple[Any, Any]:
    return (x, y)  # a tuple: comes back a list under the json serializer


@app.task(name="cv.reserve")
def reserve(*args: Any) -> str:
    """``reserve(tag, item)``, or in a chain ``reserve(previous, tag, item)``."""
    tag, item = args[-2], args[-1]
    note(tag, "reserve", item)
    return f"{tag}/{item}"


@app.task(name="cv.decline")
def decline(*args: Any) -> str:
    tag, item = args[-2], args[-1]
    note(tag, "decline", item)
    raise ValueError(f"declined {item}")


@app.task(name="cv.release")
def release(reservation: str) -> None:
    """An undo task written for the task's result: ``def release(reservation)``."""
    note(reservation.split("/")[0], "release", reservation)


@app.task(name="cv.release_envelope")
def release_envelope(envelope: dict[str, Any]) -> None:
    """The opt-in: it receives the whole compensation envelope."""
    note(envelope["output"].split("/")[0], "release_envelope", envelope)


@app.task(name="cv.errback")
def errback(info: Any, tag: str) -> None:
    note(tag, "errback", info)


@app.task(name="cv.collect")
def collect(value: Any, tag: str) -> Any:
    note(tag, "link", value)
    return value


@app.task(name="cv.slow")
def slow(tag: str, item: int, seconds: float) -> int:
    """A header member that takes a while (the kill -9 test kills its worker meanwhile)."""
    note(tag, "slow", item)
    time.sleep(seconds)
    return item


@app.task(name="cv.big")
def big(tag: str, size: int) -> str:
    """A header member with a large result (the chord body's list input goes over the cap)."""
    note(tag, "big", size)
    return f"{tag}/" + "x" * size


@app.task(name="cv.unbig")
def unbig(value: str) -> None:
    note(value.split("/")[0], "unbig", len(value))


@app.task(name="cv.lengths")
def lengths(values: list[str]) -> list[int]:
    return [len(v) for v in values]


@app.task(name="cv.grow", bind=True)
def grow(self: Any, tag: str) -> Any:
    """A body that grows the canvas at run time: ``Task.replace``."""
    note(tag, "grow", 1)
    return self.replace(add.si(1, 1))


@app.task(name="cv.as_set")
def as_set(tag: str) -> Any:
    note(tag, "as_set", 1)
    return {1, 2}  # not JSON: Celery's json serializer would fail too
