"""Schedule lateness — how late does a tick fire? ``--sched-count`` schedules (1,000) of one
interval (``--sched-every`` seconds; jitter 0, ``overlap="allow_all"``), anchored at the epoch, so
each tick is a burst of 1,000 due at the same instant. A tick's lateness is its run's creation
(the executions row's ``created_at``) minus the nominal tick (the tick id's time). Measured over
``--sched-rounds`` ticks with 1 and with 2 ``harvest scheduler`` processes, then Celery Beat on
the same 1,000 entries (``benchmarks.beat_app``: timedelta entries of the same interval; its
lateness is the time an entry's message was sent minus its due time, ``last_run_at +
run_every``). No worker runs: the firing is measured, not the runs or the tasks. A tick with no
run once its wait is over is counted "not fired" (the scheduler counted it missed)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, ROOT, harvest_client, log, pct, ratio

UTC = timezone.utc
STRAGGLERS = 30.0  # seconds past a config's last tick to wait for its late runs


def _spawn(cmd: list[str], log_path: Path, **env: str) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _stats(lateness_s: list[float], expected: int) -> dict[str, Any]:
    if not lateness_s:
        return {"ticks": expected, "fired": 0, "not_fired": expected}
    return {
        "ticks": expected,
        "fired": len(lateness_s),
        "not_fired": expected - len(lateness_s),
        "median_ms": pct(lateness_s, 50) * 1000,
        "p99_ms": pct(lateness_s, 99) * 1000,
        "max_ms": max(lateness_s) * 1000,
    }


def _db_now(harvest: Any) -> datetime:
    import sqlalchemy as sa

    with harvest.store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()  # type: ignore[no-any-return]


def _created(harvest: Any, ids: list[str]) -> dict[str, datetime]:
    import sqlalchemy as sa

    from harvest_celery._store.schema import executions

    with harvest.store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(executions.c.id, executions.c.created_at).where(executions.c.id.in_(ids))
        )
        return {r.id: r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=UTC) for r in rows}


def harvest_side(args: Any, names: list[str], schedulers: int) -> dict[str, Any]:
    """``schedulers`` processes fire the schedules over ``--sched-rounds`` ticks, after one
    interval of start-up (their first pass counts the ticks of the pause before it missed)."""
    from harvest_celery._core.schedule import tick_id

    harvest = harvest_client()
    every = args.sched_every
    procs = [
        _spawn(
            [sys.executable, "-m", "harvest_celery", "-A", "benchmarks.app:harvest", "scheduler"],
            RESULTS / f"scheduler-{schedulers}-{i}.log",
        )
        for i in range(schedulers)
    ]
    try:
        start = _db_now(harvest).timestamp() + every
        first = math.ceil(start / every) * every
        ticks = [datetime.fromtimestamp(first + k * every, UTC) for k in range(args.sched_rounds)]
        ids = {tick_id(n, t): t for n in names for t in ticks}
        deadline = ticks[-1] + timedelta(seconds=STRAGGLERS)
        found: dict[str, datetime] = {}
        while len(found) < len(ids) and _db_now(harvest) < deadline:
            time.sleep(1.0)
            found = _created(harvest, list(ids))
    finally:
        for p in procs:
            _stop(p)
    found = _created(harvest, list(ids))
    lateness = [(found[i] - t).total_seconds() for i, t in ids.items() if i in found]
    return {
        "label": f"harvest, {schedulers} scheduler{'s' if schedulers > 1 else ''}",
        **_stats(lateness, len(ids)),
    }


def beat_side(args: Any) -> dict[str, Any]:
    """Celery Beat with the same entries, over the same number of bursts."""
    out = RESULTS / "beat-lateness.txt"
    out.unlink(missing_ok=True)
    proc = _spawn(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchmarks.beat_app",
            "beat",
            "-S",
            "benchmarks.beat_app:TimedScheduler",
            "-l",
            "WARNING",
        ],
        RESULTS / "beat.log",
        HARVEST_BENCH_BEAT_ENTRIES=str(args.sched_count),
        HARVEST_BENCH_BEAT_EVERY=str(args.sched_every),
        HARVEST_BENCH_BEAT_OUT=str(out),
    )
    expected = args.sched_count * args.sched_rounds
    deadline = time.monotonic() + 30 + args.sched_every * (args.sched_rounds + 1) + STRAGGLERS
    lines: list[str] = []
    try:
        while len(lines) < expected and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1.0)
            lines = out.read_text().splitlines() if out.exists() else []
    finally:
        _stop(proc)
    lateness = [float(sent) - float(due) for _name, due, sent in (ln.split() for ln in lines[:expected])]
    return {"label": "Celery Beat, 1 process", **_stats(lateness, expected)}


def run(args: Any, _dbos: dict[str, Any]) -> dict[str, Any]:
    harvest = harvest_client()
    names = [f"lat-{i:04d}" for i in range(args.sched_count)]
    log(f"Schedule lateness: creating {len(names)} schedules every {args.sched_every} s…")
    for name in names:
        harvest.create_schedule(
            name,
            workflow="bench_seq",
            every=timedelta(seconds=args.sched_every),
            input=0,
            overlap="allow_all",
        )
    res: dict[str, Any] = {
        "schedules": len(names),
        "every_s": args.sched_every,
        "rounds": args.sched_rounds,
        "systems": {},
    }
    for n in (1, 2):
        log(f"Schedule lateness: harvest, {n} scheduler process(es), {args.sched_rounds} ticks…")
        res["systems"][f"harvest_{n}"] = harvest_side(args, names, n)
    for name in names:
        harvest.delete_schedule(name)  # nothing fires during Beat's turn
    log(f"Schedule lateness: Celery Beat, {args.sched_count} entries, {args.sched_rounds} ticks…")
    res["systems"]["beat"] = beat_side(args)
    beat = res["systems"]["beat"]
    for key in ("harvest_1", "harvest_2"):
        side = res["systems"][key]
        side["median_over_beat"] = ratio(side.get("median_ms"), beat.get("median_ms"))
        side["p99_over_beat"] = ratio(side.get("p99_ms"), beat.get("p99_ms"))
    return res
