"""Schedules in embedded mode (SQLite, one process): create refuses bad input and writes
nothing; a due tick fires once with its nominal ``scheduled_for``; pause, resume, trigger and
delete. The multi-process guarantees are tests/integration/test_schedules.py's."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from harvest_celery import (
    Harvest,
    InvalidSchedule,
    ScheduleAlreadyExists,
    ScheduleNotFound,
    UnknownWorkflow,
    WorkflowContext,
    workflow,
)
from harvest_celery._cli import main


@workflow(name="se.tick")
async def se_tick(ctx: WorkflowContext, data: object) -> dict[str, object]:
    when = ctx.info.scheduled_for
    return {"data": data, "scheduled_for": when.isoformat() if when else None}


@workflow(name="se.keyed", concurrency=1, limit_key=lambda data: data["customer"])
async def se_keyed(ctx: WorkflowContext, data: object) -> object:
    return data


@pytest.fixture
def h(tmp_path):
    harvest = Harvest(f"sqlite:///{tmp_path / 's.db'}").register(se_tick, se_keyed)
    harvest.migrate()
    return harvest


def test_bad_input_writes_nothing(h):
    with pytest.raises(InvalidSchedule, match="exactly one"):
        h.create_schedule("s", workflow="se.tick")
    with pytest.raises(InvalidSchedule, match="end_at"):
        h.create_schedule(
            "s",
            workflow="se.tick",
            every=timedelta(seconds=5),
            end_at=datetime(2020, 1, 1, tzinfo=timezone.utc),
        )
    with pytest.raises(InvalidSchedule, match="max_runs"):
        h.create_schedule("s", workflow="se.tick", every=timedelta(seconds=5), max_runs=0)
    with pytest.raises(InvalidSchedule, match="input"):
        h.create_schedule("s", workflow="se.tick", every=timedelta(seconds=5), input=object())
    with pytest.raises(InvalidSchedule, match="overlap"):
        h.create_schedule("s", workflow="se.tick", every=timedelta(seconds=5), overlap="cancel_other")
    with pytest.raises(InvalidSchedule, match="catchup_window"):
        h.create_schedule(
            "s", workflow="se.tick", every=timedelta(seconds=5), catchup_window=timedelta(seconds=-1)
        )
    with pytest.raises(UnknownWorkflow):
        h.create_schedule("s", workflow="nope", every=timedelta(seconds=5))
    assert h.list_schedules() == []
    h.create_schedule("s", workflow="se.tick", every=timedelta(seconds=5))
    with pytest.raises(ScheduleAlreadyExists):
        h.create_schedule("s", workflow="se.tick", every=timedelta(seconds=9))
    assert [s["every_seconds"] for s in h.list_schedules()] == [5]


def test_a_due_tick_fires_once_with_its_nominal_time(h):
    h.create_schedule(
        "s", workflow="se.tick", every=timedelta(seconds=1), input={"v": 1}, overlap="allow_all"
    )
    fired: list[str] = []
    deadline = time.monotonic() + 10
    while not fired and time.monotonic() < deadline:
        fired = [run_id for f in h.fire_schedules() for run_id in f.fired]
        time.sleep(0.05)
    assert len(fired) >= 1 and fired[0].startswith("s@")
    nominal = datetime.strptime(fired[0][2:], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    h.drain()
    answer = h.result(fired[0])
    assert answer == {"data": {"v": 1}, "scheduled_for": nominal.isoformat()}
    assert h.describe(fired[0]).status == "COMPLETED"
    assert h.describe_schedule("s")["fired"] == len(fired)


def test_pause_resume_trigger_delete(h):
    h.create_schedule("s", workflow="se.tick", every=timedelta(hours=1), input={"v": 2})
    h.pause_schedule("s", "maintenance")
    view = h.describe_schedule("s")
    assert view["paused"] and view["pause_note"] == "maintenance"
    assert h.resume_schedule("s") == 0 and not h.describe_schedule("s")["paused"]
    run_id = h.trigger_schedule("s")
    assert run_id is not None and run_id.startswith("s@manual-") and len(run_id) == len("s@manual-") + 8
    assert h.result(run_id)["data"] == {"v": 2}
    assert h.describe_schedule("s")["runs"] == 0  # trigger-now counts toward no max_runs
    h.delete_schedule("s")
    with pytest.raises(ScheduleNotFound):
        h.describe_schedule("s")


def test_the_scheduler_refuses_to_start_without_an_app(monkeypatch, capsys):
    monkeypatch.delenv("HARVEST_APP", raising=False)
    assert main(["scheduler"]) == 2
    assert "needs --app" in capsys.readouterr().err


def test_a_backfill_killed_mid_way_resumes_from_its_cursor(h, monkeypatch):
    from harvest_celery._store import schedules as rows

    h.create_schedule("b", workflow="se.tick", every=timedelta(minutes=1))
    end = datetime.fromisoformat(h.describe_schedule("b")["last_tick"]).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=9)  # ten nominal ticks
    real, calls = rows.backfill_tick, []

    def dies_after_four(tx, name, tick, queue, admit=None):
        if len(calls) == 4:
            raise KeyboardInterrupt  # the process is killed mid-way
        calls.append(tick)
        return real(tx, name, tick, queue, admit)

    monkeypatch.setattr(rows, "backfill_tick", dies_after_four)
    with pytest.raises(KeyboardInterrupt):
        h.backfill_schedule("b", start, end)
    monkeypatch.setattr(rows, "backfill_tick", real)
    resumed = h.backfill_schedule("b", start, end)
    assert resumed == {
        "started": [f"b@{t:%Y%m%dT%H%M}00Z" for t in (start + timedelta(minutes=m) for m in range(4, 10))],
        "already_ran": [],
    }
    again = h.backfill_schedule("b", start, end)  # a finished backfill asked again: all answer
    assert again["started"] == [] and len(again["already_ran"]) == 10
    with pytest.raises(InvalidSchedule, match="last tick"):
        h.backfill_schedule("b", start, end + timedelta(minutes=5))


def test_a_schedule_that_cannot_fire_holds_up_no_other(h):

    from harvest_celery._payloads.codec import CODEC_KEY
    from harvest_celery._store.schema import schedules

    for name in ("a-broken", "b-fine"):
        h.create_schedule(name, workflow="se.tick", every=timedelta(seconds=1), overlap="allow_all")
    with h.store.begin() as tx:  # an input encrypted with a key this process does not hold
        tx.conn.execute(
            schedules.update()
            .where(schedules.c.name == "a-broken")
            .values(input={CODEC_KEY: "fernet", "kid": "gone", "ct": "x"})
        )
    fired: list[str] = []
    deadline = time.monotonic() + 10
    while not fired and time.monotonic() < deadline:
        fired = [run_id for f in h.fire_schedules() for run_id in f.fired]
        time.sleep(0.05)
    assert fired and all(run_id.startswith("b-fine@") for run_id in fired)
    assert h.describe_schedule("a-broken")["fired"] == 0


def test_a_tick_its_limit_key_refuses_pauses_its_schedule_once_with_the_reason(h, caplog):
    from harvest_celery._store.schema import schedules

    h.create_schedule("keyed", workflow="se.keyed", every=timedelta(seconds=1), input={"customer": "a"})
    with h.store.begin() as tx:  # an input the key can no longer read: every tick would refuse it
        tx.conn.execute(schedules.update().where(schedules.c.name == "keyed").values(input={"nobody": 1}))
    time.sleep(1.1)
    with caplog.at_level("ERROR", logger="harvest_celery"):
        assert h.fire_schedules() == []
        assert h.fire_schedules() == []  # paused: the second pass neither fires nor logs again
    described = h.describe_schedule("keyed")
    assert described["paused"] is True
    assert described["pause_note"].startswith("paused by the scheduler: invalid limit key")
    assert described["fired"] == 0
    reason = described["pause_note"].removeprefix("paused by the scheduler: ")
    assert [r.getMessage() for r in caplog.records] == [f"scheduler: schedule keyed paused: {reason}"]


def test_a_pass_slower_than_the_on_time_margin_misses_no_tick(h, monkeypatch):
    """A burst: each schedule's turn in the pass comes 6 s after the last one's (more than the
    5 s margin), as with a thousand schedules due at once. None of their ticks fell due before
    the pass began, so none is missed."""
    from harvest_celery._store import schedules as rows

    for name in ("a", "b", "c"):
        h.create_schedule(name, workflow="se.tick", every=timedelta(seconds=1), overlap="allow_all")
    time.sleep(1.1)  # a tick of each is due
    real, calls = rows.db_now, []

    def slow_clock(tx):
        calls.append(1)
        return real(tx) + timedelta(seconds=6 * (len(calls) - 1))  # the pass's start, then +6 s a row

    monkeypatch.setattr(rows, "db_now", slow_clock)
    done = {f.name: f for f in h.fire_schedules()}
    assert set(done) == {"a", "b", "c"}
    assert [done[n].missed for n in ("a", "b", "c")] == [0, 0, 0]
    assert all(f.fired for f in done.values())


@workflow(name="se.chain")
async def se_chain(ctx: WorkflowContext, n: int) -> int:
    if n < 1:
        ctx.continue_as_new(n + 1)
    await ctx.wait_signal("go")
    return n


def test_overlap_sees_a_continue_as_new_chain_as_open_until_its_last_link_closes(h):
    h.register(se_chain)
    h.create_schedule("c", workflow="se.chain", every=timedelta(hours=1), input=0, overlap="skip")
    first = h.trigger_schedule("c")
    assert first is not None
    assert h.describe(first).status == "CONTINUED_AS_NEW"  # the chain's next link waits
    assert h.trigger_schedule("c") is None  # skipped: the chain is open
    assert h.describe_schedule("c")["skipped"] == 1
    h.signal(first, "go")  # routed to the chain's current run
    assert h.result(first) == 1
    assert h.trigger_schedule("c") is not None  # the last link closed: the next one starts
