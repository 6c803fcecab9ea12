"""Schedules on real Postgres, Redis, Celery worker and ``harvest scheduler`` processes.

Nothing is asserted on time: a test waits until the stored counters show what it needs, then
judges the runs and counters that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from harvest_celery import InvalidSchedule, ScheduleAlreadyExists, UnknownWorkflow
from harvest_celery._core.schedule import Spec, tick_id
from tests.integration.conftest import DATABASE_URL, LOG_DIR, ROOT, Worker
from tests.processes import kill_group, stop_group

pytestmark = pytest.mark.integration
SLOT = os.environ.get("HARVEST_TEST_SLOT", "0")
QUEUE = f"sched-{SLOT}"
UTC = timezone.utc


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HARVEST_TEST_SCHED_QUEUE": QUEUE, **extra}


class Scheduler:
    """A ``harvest -A tests.integration.sched_app:harvest scheduler`` process."""

    def __init__(self, name: str, *args: str, **env: str) -> None:
        self.log = LOG_DIR / f"scheduler-{name}.log"
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "harvest_celery",
                    "-A",
                    "tests.integration.sched_app:harvest",
                    "scheduler",
                    *self.args,
                ],
                cwd=ROOT,
                env=_env(**self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def fired(self) -> list[str]:
        return [line[6:] for line in Path(self.log).read_text().splitlines() if line.startswith("fired ")]

    def stop(self) -> None:
        stop_group(self.proc)

    def kill9(self) -> None:
        assert self.proc is not None
        kill_group(self.proc)


@pytest.fixture(scope="module")
def sched(harvest: Any) -> Any:
    os.environ["HARVEST_TEST_SCHED_QUEUE"] = QUEUE
    os.environ.setdefault("HARVEST_TEST_SCHED_CODEC", Fernet.generate_key().decode())  # every process
    from tests.integration.sched_app import harvest as h

    h.runtime.settings.decision_queue = QUEUE
    return h


@pytest.fixture(autouse=True)
def no_schedule_left(sched: Any) -> Iterator[None]:
    """Each test's schedules are deleted after it: a later test's schedulers fire only its own."""
    yield
    for s in sched.list_schedules():
        sched.delete_schedule(s["name"])


@pytest.fixture
def sched_worker(sched: Any) -> Iterator[Worker]:
    """A worker of the schedules' app, not yet started: its sweeper fires schedules too, so a
    test starts it when its runs must run. Stopped after the test."""
    worker = Worker("sched", QUEUE, {"HARVEST_TEST_SCHED_QUEUE": QUEUE}, app="tests.integration.sched_app")
    try:
        yield worker
    finally:
        worker.stop()


def _row(name: str) -> dict[str, Any]:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM harvest_schedules WHERE name = :n"), {"n": name}).first()
        runs = conn.execute(
            sa.text(
                "SELECT id, status, created_at, closed_at FROM harvest_executions WHERE id LIKE :p ORDER BY id"
            ),
            {"p": f"{name}@%"},
        ).all()
    engine.dispose()
    assert row is not None
    return {"row": row._mapping, "runs": [r._mapping for r in runs]}


def _wait(check: Any, what: str, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.25)


def _ticks(name: str, every: int, after: datetime, until: datetime) -> list[str]:
    return [tick_id(name, t) for t in Spec(every=every).ticks(after, until)]


def test_two_schedulers_fire_exactly_one_run_per_tick(sched, tag):
    name = f"two-{tag}"
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    created = _row(name)["row"]["created_at"]
    a, b = Scheduler(f"a-{tag}"), Scheduler(f"b-{tag}")
    a.start()
    b.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 15, "15 fired ticks")
    finally:
        a.stop()
        b.stop()
    state = _row(name)
    ids = [r["id"] for r in state["runs"]]
    expected = _ticks(name, 2, created, state["row"]["last_tick"])
    assert ids == expected  # one run per tick, and the ticks are contiguous
    assert sorted(a.fired() + b.fired()) == ids  # no tick fired twice, none by anyone else
    assert a.fired() and b.fired()  # both schedulers fired ticks
    assert state["row"]["fired"] == len(ids) and state["row"]["missed"] == state["row"]["skipped"] == 0


@pytest.mark.parametrize("overlap", ["allow_all", "skip"])
def test_a_restarted_scheduler_catches_up_within_its_window(sched, sched_worker, tag, overlap):
    name = f"catch-{overlap.replace('_', '-')}-{tag}"
    sched.create_schedule(
        name,
        workflow="sched.tick",
        every=timedelta(seconds=2),
        overlap=overlap,
        catchup_window=timedelta(seconds=10),
    )
    s = Scheduler(f"c-{tag}")
    sched_worker.start()  # its sweeper fires too: the outage stops both
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 2, "two fired ticks")
    finally:
        s.stop()
        sched_worker.stop()
    before = _row(name)
    time.sleep(20)  # the outage (not an assertion)
    sched_worker.start()
    s.start()
    try:
        _wait(
            lambda: _row(name)["row"]["last_tick"] > before["row"]["last_tick"] + timedelta(seconds=20),
            "catch-up",
        )
    finally:
        s.stop()
        sched_worker.stop()
    after = _row(name)["row"]
    assert after["missed"] >= 1  # the ticks older than the window
    ticks = _ticks(name, 2, before["row"]["last_tick"], after["last_tick"])
    fired = [r["id"] for r in _row(name)["runs"] if r["id"] > tick_id(name, before["row"]["last_tick"])]
    if overlap == "allow_all":
        assert len(fired) + after["missed"] == len(ticks)
        assert fired == ticks[after["missed"] :]  # the older ticks missed, every in-window one fired once
    else:
        # the catch-up pass fires exactly the oldest in-window tick and skips the rest of the
        # window (a 10 s window holds at least four 2 s ticks, so the second one is among them)
        assert fired[0] == ticks[after["missed"]]
        assert ticks[after["missed"] + 1] not in fired
        assert after["skipped"] >= 1
        assert after["fired"] + after["skipped"] + after["missed"] == len(
            _ticks(name, 2, _row(name)["row"]["created_at"], after["last_tick"])
        )


def test_overlap_skip_never_overlaps_runs(sched, sched_worker, tag):
    name = f"skip-{tag}"
    sched.create_schedule(name, workflow="sched.slow", every=timedelta(seconds=2))
    sched_worker.start()
    s = Scheduler(f"s-{tag}")
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 3, "three runs")
    finally:
        s.stop()
    state = _row(name)
    runs = state["runs"]
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier["closed_at"] is not None and earlier["closed_at"] <= later["created_at"]
    ticks = _ticks(name, 2, state["row"]["created_at"], state["row"]["last_tick"])
    assert state["row"]["skipped"] == len(ticks) - len(runs)


def test_overlap_skip_treats_a_continue_as_new_chain_as_open_until_its_last_link_closes(
    sched, sched_worker, tag
):
    name = f"chain-{tag}"
    sched.create_schedule(name, workflow="sched.chain", every=timedelta(seconds=2))
    sched_worker.start()
    s = Scheduler(f"ch-{tag}")
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 1, "the first tick")
        first = _row(name)["row"]["last_run_id"]
        _wait(lambda: sched.describe(first).continued_to is not None, "the chain's second link")
        link = sched.describe(first).continued_to
        skipped = _row(name)["row"]["skipped"]
        _wait(lambda: _row(name)["row"]["skipped"] >= skipped + 2, "two ticks skipped")
        assert _row(name)["row"]["fired"] == 1  # its first link closed, the chain is open
        sched.signal(first, "go", "done")  # routed to the chain's current run
        assert sched.result(first, timeout=60) == "done"
        _wait(lambda: _row(name)["row"]["fired"] >= 2, "a tick once the chain closed")
    finally:
        s.stop()
    runs = {r["id"]: r for r in _row(name)["runs"]}  # the links' ids share the ticks' prefix
    assert runs[first]["status"] == "CONTINUED_AS_NEW" and runs[link]["status"] == "COMPLETED"
    later = [r for i, r in runs.items() if i not in (first, link)]
    assert later  # the tick that fired once the chain closed (and its own link, if it has one)
    assert all(r["created_at"] >= runs[link]["closed_at"] for r in later)  # none while it was open


def test_scheduled_for_is_the_nominal_tick_of_a_catch_up(sched, sched_worker, tag):
    name = f"when-{tag}"
    sched.create_schedule(
        name,
        workflow="sched.tick",
        every=timedelta(seconds=2),
        overlap="allow_all",
        catchup_window=timedelta(seconds=30),
    )
    time.sleep(6)  # no scheduler: the ticks fall due, to fire late
    s = Scheduler(f"w-{tag}")
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 2, "the catch-up")
    finally:
        s.stop()
    sched_worker.start()  # now the runs run (its sweeper would have fired the ticks on time)
    first = _row(name)["runs"][0]["id"]
    answer = sched.result(first, timeout=60)
    nominal = datetime.strptime(first.split("@")[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert datetime.fromisoformat(answer["scheduled_for"]) == nominal
    assert datetime.fromisoformat(answer["now"]) > nominal  # the fire time is not the tick


def test_bad_input_writes_nothing(sched, tag):
    name = f"bad-{tag}"
    cases = [
        (dict(cron="61 * * * *"), InvalidSchedule),
        (dict(cron="* * * * * *"), InvalidSchedule),
        (dict(cron="* * * * *", every=timedelta(seconds=5)), InvalidSchedule),
        (dict(), InvalidSchedule),
        (dict(every=timedelta(seconds=0.5)), InvalidSchedule),
        (dict(cron="* * * * *", timezone="Nowhere/Town"), InvalidSchedule),
        (dict(every=timedelta(seconds=5), timezone="UTC"), InvalidSchedule),
        (dict(every=timedelta(seconds=5), catchup_window=timedelta(seconds=-1)), InvalidSchedule),
        (dict(every=timedelta(seconds=5), end_at=datetime(2020, 1, 1, tzinfo=UTC)), InvalidSchedule),
        (dict(every=timedelta(seconds=5), max_runs=0), InvalidSchedule),
        (dict(every=timedelta(seconds=5), jitter=timedelta(seconds=5)), InvalidSchedule),
        (dict(every=timedelta(seconds=5), overlap="cancel_other"), InvalidSchedule),
        (dict(every=timedelta(seconds=5), input={1, 2}), InvalidSchedule),
    ]
    for kwargs, error in cases:
        with pytest.raises(error):
            sched.create_schedule(name, workflow="sched.tick", **kwargs)
    with pytest.raises(UnknownWorkflow):
        sched.create_schedule(name, workflow="no.such", every=timedelta(seconds=5))
    for bad in ("", "a:b", "a/b", "a\x07b", "x" * 181):
        with pytest.raises(InvalidSchedule):
            sched.create_schedule(bad, workflow="sched.tick", every=timedelta(seconds=5))
    assert [s for s in sched.list_schedules() if s["name"].startswith(("bad-", "x" * 20))] == []
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=5), input={"v": 1})
    with pytest.raises(ScheduleAlreadyExists):
        sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=60), input={"v": 2})
    assert sched.describe_schedule(name)["every_seconds"] == 5


def test_two_apps_never_fire_each_others_schedules(sched, sched_worker, tag):
    """Two apps (decision queues) on one database, each firing in its own processes: app A's
    scheduler and worker (whose sweeper fires too), app B's scheduler. Each schedule is fired by
    its own app only, once per tick."""
    mine, theirs = f"mine-{tag}", f"theirs-{tag}"
    other = f"{QUEUE}-other"
    sched.create_schedule(mine, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    sched.runtime.settings.decision_queue = other  # app B's Harvest
    try:
        sched.create_schedule(theirs, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    finally:
        sched.runtime.settings.decision_queue = QUEUE
    created = {n: _row(n)["row"]["created_at"] for n in (mine, theirs)}
    a, b = Scheduler(f"oa-{tag}"), Scheduler(f"ob-{tag}", HARVEST_TEST_SCHED_QUEUE=other)
    sched_worker.start()
    a.start()
    b.start()
    try:
        _wait(lambda: min(_row(n)["row"]["fired"] for n in (mine, theirs)) >= 4, "four ticks of each")
    finally:
        a.stop()
        b.stop()
        sched_worker.stop()
    for name in (mine, theirs):
        state = _row(name)
        ids = [r["id"] for r in state["runs"]]
        assert ids == _ticks(name, 2, created[name], state["row"]["last_tick"])  # once per tick
        assert state["row"]["fired"] == len(ids)
    assert b.fired() and all(i.startswith(f"{theirs}@") for i in b.fired())  # B fired only its own
    assert not any(i.startswith(f"{theirs}@") for i in a.fired())  # A never fired B's
    theirs_runs = {r["id"] for r in _row(theirs)["runs"]}
    assert sorted(b.fired()) == sorted(theirs_runs)  # nor did A's worker: every one of B's is B's


def test_the_input_is_encrypted_offloaded_and_deleted_with_the_schedule(sched, tag):
    small, big = f"small-{tag}", f"big-{tag}"
    secret = f"s3cret-{tag}"
    sched.create_schedule(small, workflow="sched.tick", every=timedelta(hours=1), input={"secret": secret})
    sched.create_schedule(
        big, workflow="sched.tick", every=timedelta(hours=1), input={"b": "x" * 4096, "s": secret}
    )
    engine = sa.create_engine(DATABASE_URL)
    q_input = sa.text("SELECT input::text FROM harvest_schedules WHERE name = :n")
    q_blobs = sa.text("SELECT data FROM harvest_blobs WHERE key LIKE :k")
    with engine.connect() as conn:
        inline = conn.execute(q_input, {"n": small}).scalar()
        reference = conn.execute(q_input, {"n": big}).scalar()
        blobs = conn.execute(q_blobs, {"k": f"schedules:{big}/%"}).scalars().all()
    assert secret not in inline and "fernet" in inline  # encrypted at rest
    assert "_harvest_offload_envelope" in reference and secret not in reference
    assert len(blobs) == 1 and secret.encode() not in bytes(blobs[0])  # offloaded, encrypted
    sched.delete_schedule(small)
    sched.delete_schedule(big)
    with engine.connect() as conn:
        left = conn.execute(
            sa.text("SELECT count(*) FROM harvest_blobs WHERE key LIKE :k"), {"k": f"schedules:{big}/%"}
        ).scalar()
        rows = conn.execute(
            sa.text("SELECT count(*) FROM harvest_schedules WHERE name IN (:a, :b)"), {"a": small, "b": big}
        ).scalar()
    engine.dispose()
    assert (left, rows) == (0, 0)


def _db_now() -> datetime:
    engine = sa.create_engine(DATABASE_URL)
    with engine.connect() as conn:
        now = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    engine.dispose()
    return now  # type: ignore[no-any-return]


def _tick_of(run_id: str) -> datetime:
    return datetime.strptime(run_id.split("@")[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def test_a_scheduler_killed_mid_run_loses_and_doubles_no_tick(sched, tag):
    name = f"kill-{tag}"
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    created = _row(name)["row"]["created_at"]
    a, b = Scheduler(f"ka-{tag}"), Scheduler(f"kb-{tag}")
    a.start()
    b.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 4, "four ticks")
        a.kill9()
        _wait(lambda: _row(name)["row"]["fired"] >= 10, "six more ticks")
    finally:
        a.stop()
        b.stop()
    state = _row(name)
    ids = [r["id"] for r in state["runs"]]
    assert ids == _ticks(name, 2, created, state["row"]["last_tick"])  # none lost, none doubled
    assert state["row"]["fired"] == len(ids) and state["row"]["missed"] == 0
    printed = a.fired() + b.fired()
    assert len(printed) == len(set(printed)) and set(printed) <= set(ids)


def test_a_cron_edit_while_two_schedulers_run_fires_no_old_tick_after_it(sched, tag):
    """every 2 s, edited to the cron ``* * * * *`` (one tick a minute), then back to every 3 s:
    after each edit commits, only ticks of the new spec fire, and none fires twice."""
    name = f"edit-{tag}"
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    a, b = Scheduler(f"ea-{tag}"), Scheduler(f"eb-{tag}")
    a.start()
    b.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 3, "three ticks of the old spec")
        assert sched.update_schedule(name, cron="* * * * *", timezone="UTC") == 2
        to_cron = _db_now()  # after the edit committed
        fired_then = _row(name)["row"]["fired"]
        _wait(lambda: _row(name)["row"]["fired"] > fired_then, "the cron's first tick", limit=150)
        assert sched.update_schedule(name, every=timedelta(seconds=3)) == 3
        to_every = _db_now()
        fired_then = _row(name)["row"]["fired"]
        _wait(lambda: _row(name)["row"]["fired"] >= fired_then + 3, "three ticks of every 3 s")
    finally:
        a.stop()
        b.stop()
    state = _row(name)
    assert state["row"]["spec_version"] == 3
    cron = [_tick_of(r["id"]) for r in state["runs"] if to_cron < r["created_at"] <= to_every]
    assert cron and all(t.second == 0 for t in cron)  # minute ticks only: no 2 s tick after the edit
    assert all(b - a == timedelta(minutes=1) for a, b in zip(cron, cron[1:], strict=False))
    later = sorted(_tick_of(r["id"]) for r in state["runs"] if r["created_at"] > to_every)
    assert len(later) >= 3 and all(t.timestamp() % 3 == 0 for t in later)  # the new spec only
    assert all(b - a == timedelta(seconds=3) for a, b in zip(later, later[1:], strict=False))
    ids = [r["id"] for r in state["runs"]]
    assert len(ids) == len(set(ids)) == state["row"]["fired"]  # none fired twice
    printed = a.fired() + b.fired()
    assert sorted(printed) == sorted(ids)


def test_buffer_one_starts_the_buffered_tick_once_the_open_run_closes(sched, sched_worker, tag):
    name = f"buffer-{tag}"
    sched.create_schedule(name, workflow="sched.slow", every=timedelta(seconds=2), overlap="buffer_one")
    sched_worker.start()
    s = Scheduler(f"bu-{tag}")
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 3, "three runs")
    finally:
        s.stop()
    state = _row(name)
    runs = state["runs"]
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert earlier["closed_at"] is not None and earlier["closed_at"] <= later["created_at"]
        # the buffered tick is older than the run that was open when it fell due closed
        assert _tick_of(later["id"]) < earlier["closed_at"]
    assert state["row"]["skipped"] >= 1  # further ticks were skipped, only one buffered
    ticks = _ticks(name, 2, state["row"]["created_at"], state["row"]["last_tick"])
    buffered = 1 if state["row"]["buffered_tick"] is not None else 0
    assert state["row"]["fired"] + state["row"]["skipped"] + buffered == len(ticks)


def test_trigger_now_and_backfill_ids(sched, sched_worker, tag):
    name = f"trig-{tag}"
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    s = Scheduler(f"t-{tag}")
    s.start()
    try:
        _wait(lambda: _row(name)["row"]["fired"] >= 3, "three ticks")
    finally:
        s.stop()
    sched_worker.start()
    run_id = sched.trigger_schedule(name)
    assert run_id is not None and re.fullmatch(rf"{name}@manual-[0-9a-f]{{8}}", run_id)
    assert sched.result(run_id, timeout=60)["scheduled_for"] is not None
    row = _row(name)["row"]
    assert row["runs"] == row["fired"] - 1  # trigger-now counts toward no max_runs
    start, end = row["created_at"] - timedelta(seconds=10), row["last_tick"]
    with pytest.raises(InvalidSchedule):
        sched.backfill_schedule(name, start, end + timedelta(seconds=2))  # a future tick
    fired = {r["id"] for r in _row(name)["runs"]}
    first = sched.backfill_schedule(name, start, end)
    assert set(first["already_ran"]) == {i for i in fired if "@manual-" not in i}
    in_range = _ticks(name, 2, start - timedelta(microseconds=1), end)
    assert sorted(first["started"] + first["already_ran"]) == in_range
    assert set(_ticks(name, 2, start - timedelta(microseconds=1), row["created_at"])) <= set(first["started"])
    again = sched.backfill_schedule(name, start, end)  # a resumed backfill starts nothing twice
    assert again["started"] == [] and sorted(again["already_ran"]) == sorted(
        first["already_ran"] + first["started"]
    )


def test_a_backfill_killed_mid_way_resumes_from_its_cursor(sched, tag):
    """``harvest schedules backfill`` over 1,000 past ticks, killed -9 once some have started;
    asked again for the same range, it starts the rest and never looks at the ticks before its
    cursor. Its runs belong to another app's decision queue, so no worker ever takes them."""
    name, other = f"bf-{tag}", f"{QUEUE}-other"
    sched.runtime.settings.decision_queue = other
    try:
        sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=1), overlap="allow_all")
    finally:
        sched.runtime.settings.decision_queue = QUEUE
    end = _row(name)["row"]["last_tick"].replace(microsecond=0)
    start = end - timedelta(seconds=999)
    expected = _ticks(name, 1, start - timedelta(microseconds=1), end)
    assert len(expected) == 1000
    argv = ["schedules", "backfill", name, "--start", start.isoformat(), "--end", end.isoformat()]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harvest_celery", "-A", "tests.integration.sched_app:harvest", *argv],
        cwd=ROOT,
        env=_env(HARVEST_TEST_SCHED_QUEUE=other),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait(lambda: len(_row(name)["runs"]) >= 20 or proc.poll() is not None, "twenty backfilled runs")
    finally:
        if proc.poll() is None:
            kill_group(proc)
    before = {r["id"] for r in _row(name)["runs"]}
    assert 20 <= len(before) < len(expected)  # killed mid-way
    sched.runtime.settings.decision_queue = other
    try:
        resumed = sched.backfill_schedule(name, start, end)
    finally:
        sched.runtime.settings.decision_queue = QUEUE
    assert resumed["already_ran"] == []  # it resumed after its cursor, not from the start
    assert sorted(resumed["started"]) == sorted(set(expected) - before)
    assert sorted(r["id"] for r in _row(name)["runs"]) == expected


def _scrape(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except urllib.error.URLError:
        return {}  # not listening yet
    samples = {}
    for line in text.splitlines():
        if line.startswith("harvest_schedule"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def _sample(samples: dict[str, float], metric: str, *labels: str) -> float:
    """A sample's value whatever the order its labels are written in (0 if absent)."""
    return sum(
        v for k, v in samples.items() if k.startswith(metric + "{") and all(label in k for label in labels)
    )


def test_the_scheduler_exports_its_tick_counters_and_lag(sched, tag):
    name = f"metrics-{tag}"
    sched.create_schedule(name, workflow="sched.tick", every=timedelta(seconds=2), overlap="allow_all")
    port = int(os.environ.get("HARVEST_TEST_METRICS_PORT", "19808")) + 7
    s = Scheduler(f"m-{tag}", "--metrics-port", str(port))
    s.start()
    try:
        _wait(lambda: len(s.fired()) >= 2, "two ticks fired by this scheduler")
        _wait(
            lambda: (
                _sample(
                    _scrape(port), "harvest_schedule_ticks_total", 'outcome="fired"', 'workflow="sched.tick"'
                )
                >= len(s.fired())
            ),
            "the counter",
        )
        samples = _scrape(port)
    finally:
        s.stop()
    assert _sample(samples, "harvest_schedule_lag_seconds", 'workflow="sched.tick"') >= 0
    assert any(k.startswith('harvest_schedule_failing{workflow="sched.tick"') for k in samples)
