"""Stuck runs explain themselves: which queues live workers consume (asked, cached, never raising),
the hints computed from activity rows against that set, and ``Harvest.stuck`` over SQLite with a
Celery app whose broker is never reached (the workers' answer is injected)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from harvest_celery import Harvest, WorkflowContext, activity, workflow
from harvest_celery._cli import waiting_line
from harvest_celery._runtime.consumers import (
    FAILURE_TTL,
    QueueConsumers,
    consumed_queues,
    waiting_hints,
)

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


# ── the workers' answer ──────────────────────────────────────────────────────────────────────
def test_consumed_queues_reads_every_workers_queue_names():
    replies = {
        "w1@h": [{"name": "harvest", "exchange": {"name": "harvest"}}, {"name": "default"}],
        "w2@h": [{"name": "payments"}, {"name": "default"}],
    }
    assert consumed_queues(replies) == {"harvest", "default", "payments"}


def test_no_reply_means_no_live_worker_and_junk_is_skipped():
    assert consumed_queues(None) == frozenset()
    assert consumed_queues({}) == frozenset()
    assert consumed_queues({"w@h": None, "v@h": [None, {"name": ""}, {"x": 1}, "q", {"name": "ok"}]}) == {
        "ok"
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """An inspector answering from a list (an exception is raised), counting its calls."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_the_answer_is_cached_for_the_ttl_then_asked_again():
    clock = FakeClock()
    inspector = Counting({"w@h": [{"name": "a"}]}, {"w@h": [{"name": "b"}]})
    consumers = QueueConsumers(None, ttl=15, inspector=inspector, clock=clock)
    assert consumers.queues() == {"a"}
    clock.now += 14.9
    assert consumers.queues() == {"a"}
    assert inspector.calls == 1
    clock.now += 0.2
    assert consumers.queues() == {"b"}
    assert inspector.calls == 2
    consumers.forget()
    consumers.queues()
    assert inspector.calls == 3


def test_no_worker_is_an_answer_and_is_cached_too():
    clock = FakeClock()
    inspector = Counting(None)
    consumers = QueueConsumers(None, ttl=15, inspector=inspector, clock=clock)
    assert consumers.queues() == frozenset()
    clock.now += 10
    assert consumers.queues() == frozenset()
    assert inspector.calls == 1


def test_a_broker_error_is_unknown_never_raised_and_retried_sooner(caplog):
    clock = FakeClock()
    inspector = Counting(ConnectionError("broker down"), {"w@h": [{"name": "a"}]})
    consumers = QueueConsumers(None, ttl=30, inspector=inspector, clock=clock)
    assert consumers.queues() is None
    assert "broker down" in caplog.text
    clock.now += FAILURE_TTL - 0.1
    assert consumers.queues() is None
    assert inspector.calls == 1
    clock.now += 0.2
    assert consumers.queues() == {"a"}


def test_concurrent_readers_share_one_broadcast():
    started = threading.Event()

    def slow():
        started.set()
        time.sleep(0.2)
        return {"w@h": [{"name": "a"}]}

    calls = []
    consumers = QueueConsumers(None, ttl=15, inspector=lambda: calls.append(1) or slow())
    results = []
    threads = [threading.Thread(target=lambda: results.append(consumers.queues())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [frozenset({"a"})] * 8
    assert len(calls) == 1


def test_an_unreachable_broker_answers_unknown_quickly():
    app = Celery("nowhere", broker="redis://127.0.0.1:1/0")
    consumers = QueueConsumers(app, timeout=0.5)
    began = time.monotonic()
    assert consumers.queues() is None
    assert time.monotonic() - began < 5


# ── the hints ────────────────────────────────────────────────────────────────────────────────
def row(name, queue, status="scheduled", attempt=1, event_seq=3, dispatched_at=None, started_at=None):
    return {
        "activity_name": name,
        "queue": queue,
        "status": status,
        "attempt": attempt,
        "event_seq": event_seq,
        "dispatched_at": dispatched_at or ago(1),
        "started_at": started_at,
    }


def test_an_open_activity_on_a_queue_nobody_consumes_is_a_hint():
    rows = [row("charge_payment", "payments", event_seq=3), row("reserve", "inventory", event_seq=4)]
    hints = waiting_hints(rows, {"harvest", "inventory"}, NOW, scheduled_at={3: ago(42), 4: ago(40)})
    assert hints == [
        {"kind": "activity", "activity": "charge_payment", "queue": "payments", "waiting_seconds": 42.0}
    ]


def test_only_scheduled_rows_wait_on_their_queue():
    rows = [
        row("a", "payments", status=s) for s in ("running", "retry_wait", "completed", "failed", "cancelled")
    ]
    assert waiting_hints(rows, set(), NOW) == []
    assert waiting_hints([row("a", "payments")], {"payments"}, NOW) == []


def test_the_wait_is_since_scheduled_not_since_the_sweepers_last_resend():
    # the sweeper moves dispatched_at forward (even past now) each time it re-sends the message
    resent = row("a", "payments", event_seq=7, dispatched_at=NOW + timedelta(seconds=3))
    assert waiting_hints([resent], set(), NOW, scheduled_at={7: ago(300)})[0]["waiting_seconds"] == 300.0
    # unknown scheduling time: dispatched_at, never negative
    assert waiting_hints([resent], set(), NOW)[0]["waiting_seconds"] == 0.0
    assert waiting_hints([row("a", "q", dispatched_at=ago(9))], set(), NOW)[0]["waiting_seconds"] == 9.0


def test_a_retry_waits_since_its_previous_attempt_started():
    retry = row("a", "payments", attempt=2, event_seq=3, started_at=ago(60))
    assert waiting_hints([retry], set(), NOW, scheduled_at={3: ago(900)})[0]["waiting_seconds"] == 60.0


def test_naive_datetimes_are_utc():
    naive = row("a", "payments", event_seq=2)
    assert (
        waiting_hints([naive], set(), NOW, scheduled_at={2: ago(5).replace(tzinfo=None)})[0][
            "waiting_seconds"
        ]
        == 5.0
    )


def test_a_pending_decision_nobody_takes_is_a_hint():
    hints = waiting_hints([], {"default"}, NOW, decision=("harvest", ago(12.34)))
    assert hints == [{"kind": "decision", "queue": "harvest", "waiting_seconds": 12.3}]
    assert waiting_hints([], {"harvest"}, NOW, decision=("harvest", ago(12))) == []
    both = waiting_hints([row("a", "payments")], set(), NOW, decision=("harvest", ago(1)))
    assert [h["kind"] for h in both] == ["activity", "decision"]


# ── Harvest.stuck over SQLite (the Celery app records its sends, the workers' answer injected) ─
@activity(queue="payments")
def settle_payment(data: dict) -> str:
    return "settled"


@workflow
async def pays(ctx: WorkflowContext, data: dict) -> str:
    return await ctx.execute_activity(settle_payment, data)  # type: ignore[no-any-return]


class RecordingApp(Celery):
    def __init__(self) -> None:
        super().__init__("stuck_test", broker="memory://")
        self.sent: list[str] = []

    def send_task(self, name, **kwargs):
        self.sent.append(kwargs.get("queue"))


def answering(*queues):
    return lambda: {"w@h": [{"name": q} for q in queues]}


@pytest.fixture
def celery_harvest(tmp_path):
    # eager_start=False: the first decision waits for a decision worker (the hint tested here)
    h = Harvest(f"sqlite:///{tmp_path / 'stuck.db'}", RecordingApp(), eager_start=False)
    h.migrate()
    h.register(settle_payment, pays)
    return h


def test_stuck_names_the_decision_then_the_activity_nobody_takes(celery_harvest):
    h = celery_harvest
    run = h.start_workflow("pays", {})
    h._consumers = QueueConsumers(h.celery_app, inspector=answering("default"))
    hints = h.stuck(run)
    assert [(x["kind"], x["queue"]) for x in hints] == [("decision", "harvest")]
    h.runtime.run_decision(run)  # the decision a worker would take: schedules settle_payment
    h._consumers = QueueConsumers(h.celery_app, inspector=answering("default", "harvest"))
    hints = h.stuck(run)
    assert len(hints) == 1
    assert hints[0]["kind"] == "activity" and hints[0]["activity"] == "settle_payment"
    assert hints[0]["queue"] == "payments" and 0 <= hints[0]["waiting_seconds"] < 60
    h._consumers = QueueConsumers(h.celery_app, inspector=answering("payments", "harvest"))
    assert h.stuck(run) == []
    h.terminate(run)
    h._consumers = QueueConsumers(h.celery_app, inspector=answering())
    assert h.stuck(run) == []  # not running: nothing waits


def test_stuck_is_unknown_when_the_workers_cannot_be_asked(celery_harvest):
    h = celery_harvest
    run = h.start_workflow("pays", {})

    def down():
        raise OSError("broker down")

    h._consumers = QueueConsumers(h.celery_app, inspector=down)
    assert h.stuck(run) is None


def test_stuck_does_not_ask_the_workers_when_nothing_is_open(celery_harvest):
    h = celery_harvest
    run = h.start_workflow("pays", {})
    h.terminate(run)
    inspector = Counting(None)
    h._consumers = QueueConsumers(h.celery_app, inspector=inspector)
    assert h.stuck(run) == []
    assert inspector.calls == 0


def test_stuck_is_unknown_in_embedded_mode(tmp_path):
    h = Harvest(f"sqlite:///{tmp_path / 'embedded.db'}")
    h.migrate()
    h.register(settle_payment, pays)
    run = h.start_workflow("pays", {})
    assert h.stuck(run) is None


def test_harvest_show_words_a_hint():
    line = waiting_line(
        {"kind": "activity", "activity": "charge_payment", "queue": "payments", "waiting_seconds": 42.4},
        "proj.harvest",
    )
    assert line == (
        "waiting: activity charge_payment on queue 'payments' for 42s — no live worker "
        "consumes 'payments' (start one: harvest worker -A proj.harvest -Q payments)"
    )
    assert waiting_line({"kind": "decision", "queue": "harvest", "waiting_seconds": 3}, "p").startswith(
        "waiting: a decision on queue 'harvest' for 3s"
    )
