"""Side-by-side performance harness: harvest-celery vs raw Celery vs DBOS, one run, one table.

    python -m benchmarks.run [--steps 20] [--runs 10] [--concurrency 1] [--skip-dbos]

Same Postgres (127.0.0.1:5432, databases ``harvest_bench`` and ``dbos_bench``, both recreated
each run) and the same Redis (127.0.0.1:6379, DB 7, flushed each run). See benchmarks/README.md
for what each number means. Nothing here is a test: there are no timed assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PG_ADMIN_URL = os.environ.get("HARVEST_BENCH_ADMIN_URL",
                              "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
HARVEST_DB = "harvest_bench"
DBOS_DB = "dbos_bench"
DBOS_URL = f"postgresql://postgres@127.0.0.1:5432/{DBOS_DB}"
REDIS_URL = "redis://127.0.0.1:6379/7"
WORKER_QUEUES = "harvest,default,bench"
# Harvest.result() polls the executions row; its poll interval bounds how late the client sees
# the end of a run (on average poll/2 per workflow, i.e. poll/2/steps per step).
RESULT_POLL = 0.005


# ── small statistics ─────────────────────────────────────────────────────────────────────────
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    return seconds * 1000.0


def summary(values_s: list[float]) -> dict[str, float]:
    """Median / p95 / min / max of a list of seconds, in milliseconds."""
    if not values_s:
        return {"n": 0}
    return {"n": len(values_s), "median_ms": ms(statistics.median(values_s)),
            "p95_ms": ms(pct(values_s, 95)), "min_ms": ms(min(values_s)), "max_ms": ms(max(values_s))}


def bench_call(fn: Callable[[], Any], min_time: float = 0.3, repeats: int = 5) -> float:
    """Seconds per call of ``fn``: the median over ``repeats`` batches, each >= ``min_time``."""
    fn()
    number, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time / repeats:
            break
        number *= 2
    samples = [elapsed / number]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


# ── services ─────────────────────────────────────────────────────────────────────────────────
def fresh_database(name: str) -> None:
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()


class Worker:
    """One Celery worker subprocess running benchmarks.app (threads pool)."""

    def __init__(self, queues: str, concurrency: int, log: Path) -> None:
        self.queues, self.concurrency, self.log = queues, concurrency, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.app", "worker", "-Q", self.queues,
               "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "-P", "threads", "-c", str(self.concurrency),
               "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"benchmark worker exited at start: see {self.log}")
            if " ready." in self.log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"benchmark worker not ready after {timeout}s: see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


# ── d. decision cost vs history length (pure, in process) ────────────────────────────────────
def bench_decide(sizes: tuple[int, ...] = (10, 100, 1000)) -> dict[str, Any]:
    from benchmarks.app import bench_seq, bench_step
    from harvest_celery._core.engine import Activation, decide
    from harvest_celery.testing import Simulator

    sim = Simulator(bench_seq, bench_step)
    definition = sim.registry.workflow("bench_seq")
    rows = []
    for size in sizes:
        # WorkflowStarted + 3 events per completed step (Scheduled, Started, Completed): the
        # decision that follows the k-th completion, which schedules step k+1 (the live frontier).
        k = (size - 1) // 3
        run = sim.start("bench_seq", k + 10, execution_id=f"decide-{size}")
        for _ in range(k):
            run.decide()
            (scheduled,) = run.open_activities()
            run.execute(scheduled)
        activation = Activation(run.execution_id, "bench_seq", list(run.history), sim.config)
        check = decide(definition, activation, sim.registry)
        assert check.nd is None and len(check.commands) == 1 and check.outcome is None, check
        per_call = bench_call(lambda a=activation: decide(definition, a, sim.registry))
        rows.append({"events": len(run.history), "completed_steps": k, "us_per_decision": per_call * 1e6,
                     "us_per_event": per_call * 1e6 / len(run.history),
                     "us_per_warm_decision": bench_warm(definition, activation, sim) * 1e6})
    base = rows[0]["us_per_decision"]
    for row in rows:
        row["ratio_vs_smallest"] = row["us_per_decision"] / base
    first, last = rows[0], rows[-1]
    # growth of the cost per event: ~1 linear, >> 1 super-linear, << 1 flat or sub-linear
    per_event_growth = last["us_per_event"] / first["us_per_event"]
    if last["us_per_decision"] < 2 * first["us_per_decision"]:
        shape = "flat"
    elif per_event_growth > 2:
        shape = (f"SUPER-linear: cost per event grows x{per_event_growth:.1f} from "
                 f"{first['events']} to {last['events']} events")
    elif per_event_growth < 0.5:
        shape = "sub-linear"
    else:
        shape = "linear (cost per event roughly constant)"
    return {"rows": rows, "shape": shape,
            "note": "decide() only: excludes loading and decoding the history from Postgres, "
                    "which is also linear in history length"}


def bench_warm(definition: Any, activation: Any, sim: Any, steps: int = 8) -> float:
    """Seconds per decision of a warm execution (the sticky session the decision worker keeps):
    each step feeds the session only the three events the step appended."""
    from datetime import datetime, timezone

    from harvest_celery._core import events as ev
    from harvest_celery._core.engine import Session

    session = Session(definition, activation, sim.registry)
    now = datetime.now(timezone.utc)
    total = 0.0
    for _ in range(steps):
        (command,) = session.decision.commands
        seq = len(session.events)
        new = [ev.HistoryEvent(seq, ev.ActivityScheduled(command.activity_id, command.activity_name,
                                                         command.input, command.queue), now),
               ev.HistoryEvent(seq + 1, ev.ActivityStarted(command.activity_id, 1, "bench"), now),
               ev.HistoryEvent(seq + 2, ev.ActivityCompleted(command.activity_id, command.input + 1), now)]
        t0 = time.perf_counter()
        decision = session.advance(new, sim.config)
        total += time.perf_counter() - t0
        assert decision is not None and len(decision.commands) == 1, decision
    return total / steps


# ── e. payload codec cost ────────────────────────────────────────────────────────────────────
def representative_event() -> dict[str, Any]:
    from harvest_celery._core import events as ev

    order = {
        "order_id": "ord_9f3c2a71",
        "customer": {"id": "cus_1042", "email": "ada@example.com", "name": "Ada Lovelace",
                     "address": {"line1": "12 Analytical Row", "city": "London", "postcode": "N1 9GU",
                                 "country": "GB"}},
        "items": [{"sku": f"SKU-{i:05d}", "qty": i % 3 + 1, "unit_price_cents": 1299 + 37 * i,
                   "title": f"Widget model {i} with a reasonably descriptive title"} for i in range(6)],
        "currency": "GBP",
        "notes": "Leave at the side door.",
    }
    return ev.ActivityScheduled("act-000001", "charge_payment", order, "payments").to_data()


def bench_codec() -> dict[str, Any]:
    from cryptography.fernet import Fernet

    from harvest_celery import FernetCodec
    from harvest_celery._payloads.pipeline import Payloads

    data = representative_event()
    size = len(json.dumps(data, separators=(",", ":")).encode())
    plain = Payloads()
    fernet = Payloads(FernetCodec({"k1": Fernet.generate_key()}, "k1"))

    def roundtrip(p: Payloads) -> Callable[[], Any]:
        return lambda: p.decode_event(p.encode_event(data, "exec-1/0001"))

    assert roundtrip(fernet)() == data and roundtrip(plain)() == data
    encoded = fernet.encode_event(data, "exec-1/0001")
    rows = {
        "plain_us": bench_call(roundtrip(plain)) * 1e6,
        "fernet_us": bench_call(roundtrip(fernet)) * 1e6,
        # context: the JSON round trip every event pays anyway on its way into/out of Postgres
        "json_roundtrip_us": bench_call(lambda: json.loads(json.dumps(data))) * 1e6,
    }
    rows["fernet_encode_us"] = bench_call(lambda: fernet.encode_event(data, "exec-1/0001")) * 1e6
    rows["fernet_decode_us"] = bench_call(lambda: fernet.decode_event(encoded)) * 1e6
    return {"event_bytes": size,
            "encoded_event_bytes": len(json.dumps(encoded, separators=(",", ":")).encode()), **rows}


# ── floor ingredients: one Postgres commit ───────────────────────────────────────────────────
def bench_commit(n: int = 200) -> dict[str, Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{HARVEST_DB}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS bench_commit (i int, at timestamptz)"))
    samples = []
    with engine.connect() as conn:
        for i in range(n):
            t0 = time.perf_counter()
            conn.execute(sa.text("INSERT INTO bench_commit VALUES (:i, now())"), {"i": i})
            conn.commit()
            samples.append(time.perf_counter() - t0)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE bench_commit"))
    engine.dispose()
    return summary(samples)


# ── c. DBOS (own process) ────────────────────────────────────────────────────────────────────
def bench_dbos(steps: int, runs: int) -> dict[str, Any]:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return {"error": "the `dbos` package is not installed (pip install dbos)"}
    try:
        fresh_database(DBOS_DB)
    except Exception as exc:  # noqa: BLE001 - reported, the harness carries on
        return {"error": f"could not create database {DBOS_DB}: {exc}"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.dbos_bench", "--steps", str(steps), "--runs", str(runs),
         "--url", DBOS_URL],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"DBOS run failed (exit {proc.returncode}): " + " | ".join(tail)}
    raw = json.loads(lines[-1])
    per_step = [w / steps for w in raw["walls"]]
    return {"version": raw["version"], "per_step": summary(per_step),
            "step_call": summary(raw["step_latencies"]), "workflow": summary(raw["walls"])}


# ── a. harvest-celery ────────────────────────────────────────────────────────────────────────
def harvest_run(steps: int) -> tuple[float, list[float], float]:
    """One workflow: client wall seconds, per-step intervals (from the history) and the
    server-side span WorkflowStarted → WorkflowCompleted."""
    from benchmarks.app import harvest
    from harvest_celery._core import events as ev

    t0 = time.perf_counter()
    execution_id = harvest.start_workflow("bench_seq", steps)
    result = harvest.result(execution_id, timeout=max(60.0, steps * 2.0), poll=RESULT_POLL)
    wall = time.perf_counter() - t0
    assert result == steps, result
    history = harvest.history(execution_id)
    marks = [h.recorded_at for h in history
             if isinstance(h.event, ev.WorkflowStarted | ev.ActivityCompleted)]
    intervals = [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)]
    span = (history[-1].recorded_at - history[0].recorded_at).total_seconds()
    _phases(history)
    return wall, intervals, span


# per-step phases from the history's recorded_at stamps (collected across harvest_run calls)
PHASES: dict[str, list[float]] = {"decision": [], "dispatch_claim": [], "body_complete": []}


def _phases(history: list[Any]) -> None:
    """Split each step at its events' ``recorded_at`` stamps. The runtime stamps an event inside
    its transaction, just before the commit, so each phase holds exactly one commit:

    * decision: ActivityCompleted (or WorkflowStarted) → ActivityScheduled = the completion
      commit + outbox relay + decision-task broker hop + lock, load history, replay;
    * dispatch_claim: ActivityScheduled → ActivityStarted = the decision commit + relay +
      activity broker hop + the claim's lock and checks;
    * body_complete: ActivityStarted → ActivityCompleted = the claim commit + the body."""
    from harvest_celery._core import events as ev

    previous = None
    scheduled = started = None
    for h in history:
        e = h.event
        if isinstance(e, ev.WorkflowStarted | ev.ActivityCompleted):
            if isinstance(e, ev.ActivityCompleted) and started is not None:
                PHASES["body_complete"].append((h.recorded_at - started).total_seconds())
            previous = h.recorded_at
        elif isinstance(e, ev.ActivityScheduled) and previous is not None:
            scheduled = h.recorded_at
            PHASES["decision"].append((scheduled - previous).total_seconds())
        elif isinstance(e, ev.ActivityStarted) and scheduled is not None:
            started = h.recorded_at
            PHASES["dispatch_claim"].append((started - scheduled).total_seconds())


def bench_harvest(steps: int, runs: int) -> dict[str, Any]:
    harvest_run(steps)  # warm-up
    for samples in PHASES.values():
        samples.clear()
    walls, intervals, spans = [], [], []
    for _ in range(runs):
        wall, steps_s, span = harvest_run(steps)
        walls.append(wall)
        intervals.extend(steps_s)
        spans.append(span)
    return {"per_step": summary([w / steps for w in walls]), "step_interval": summary(intervals),
            "server_span_per_step": summary([s / steps for s in spans]), "workflow": summary(walls),
            "phases": {name: summary(list(samples)) for name, samples in PHASES.items()}}


# ── b. raw Celery ────────────────────────────────────────────────────────────────────────────
def raw_client_chain(steps: int) -> tuple[float, list[float]]:
    """``steps`` raw_step tasks, the client waiting on each result before sending the next."""
    from benchmarks.app import raw_step

    x, lat = 0, []
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        x = raw_step.apply_async((x,), queue="bench").get(timeout=30)
        lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    assert x == steps, x
    return wall, lat


def raw_celery_chain(steps: int) -> float:
    """One ``celery.chain`` of ``steps`` raw_step tasks (workers forward each result)."""
    from celery import chain

    from benchmarks.app import raw_step

    t0 = time.perf_counter()
    x = chain(raw_step.s(0), *(raw_step.s() for _ in range(steps - 1))).apply_async().get(timeout=60)
    wall = time.perf_counter() - t0
    assert x == steps, x
    return wall


def bench_raw(steps: int, runs: int) -> dict[str, Any]:
    raw_client_chain(steps)  # warm-up
    raw_celery_chain(steps)
    walls, lat, chain_walls = [], [], []
    for _ in range(runs):
        wall, step_lat = raw_client_chain(steps)
        walls.append(wall)
        lat.extend(step_lat)
        chain_walls.append(raw_celery_chain(steps))
    return {"client_waited": {"per_step": summary([w / steps for w in walls]), "step": summary(lat)},
            "celery_chain": {"per_step": summary([w / steps for w in chain_walls])}}


# ── throughput: C workflows (or C raw client-waited chains) in flight ────────────────────────
def throughput(job: Callable[[], Any], concurrency: int, total: int, steps: int) -> dict[str, Any]:
    counter = iter(range(total))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - reported after the threads join
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        return {"error": repr(errors[0])}
    return {"concurrency": concurrency, "workflows": total, "wall_s": wall,
            "workflows_per_s": total / wall, "steps_per_s": total * steps / wall}


# ── the table ────────────────────────────────────────────────────────────────────────────────
def fmt(v: Any, digits: int = 2) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or b == 0:
        return float("nan")
    return a / b


def render(res: dict[str, Any]) -> str:
    cfg = res["config"]
    h, r, d = res["harvest"], res["raw_celery"], res["dbos"]
    hs = h["per_step"]["median_ms"]
    rc = r["client_waited"]["per_step"]["median_ms"]
    rch = r["celery_chain"]["per_step"]["median_ms"]
    ds = d.get("per_step", {}).get("median_ms") if "error" not in d else None
    lines = [
        "",
        f"harvest-celery benchmark — {cfg['steps']} steps x {cfg['runs']} runs, concurrency "
        f"{cfg['concurrency']}, worker -P threads -c {cfg['worker_concurrency']}, "
        f"{res['machine']['cpus']} CPUs",
        "",
        f"{'sequential step latency (ms per step)':<58}{'median':>9}{'p95':>9}{'min':>9}{'max':>9}",
    ]

    def row(label: str, s: dict[str, Any]) -> None:
        if not s or s.get("n", 0) == 0:
            lines.append(f"{label:<58}{'n/a':>9}")
            return
        lines.append(f"{label:<58}{fmt(s['median_ms']):>9}{fmt(s['p95_ms']):>9}"
                     f"{fmt(s['min_ms']):>9}{fmt(s['max_ms']):>9}")

    row("harvest-celery  (client start→result / steps, per run)", h["per_step"])
    row("harvest-celery  (step interval from history)", h["step_interval"])
    row("harvest-celery  (server span / steps, per run)", h["server_span_per_step"])
    row("  phase Completed→Scheduled (commit, hop, load+replay)", h["phases"]["decision"])
    row("  phase Scheduled→Started  (commit, hop, claim)", h["phases"]["dispatch_claim"])
    row("  phase Started→Completed  (commit, body)", h["phases"]["body_complete"])
    row("raw Celery      (client waits each result, Redis backend)", r["client_waited"]["per_step"])
    row("raw Celery      (one celery.chain, per run)", r["celery_chain"]["per_step"])
    if "error" in d:
        lines.append(f"{'DBOS':<58}  not run: {d['error']}")
    else:
        row(f"DBOS {d['version']:<10} (workflow wall / steps, per run)", d["per_step"])
        row("DBOS            (one @DBOS.step() call incl. checkpoint)", d["step_call"])
    lines += [
        "",
        "ratios (median ms per step)",
        f"  harvest / raw Celery (client-waited) ...... {fmt(ratio(hs, rc))}x",
        f"  harvest / raw Celery (celery.chain) ....... {fmt(ratio(hs, rch))}x",
        f"  harvest / DBOS ............................ {fmt(ratio(hs, ds))}x",
    ]
    floor = res["floor"]
    lines += [
        "",
        "floor: 2 broker hops + 3 commits per sequential activity",
        f"  Postgres single-row commit median ......... {fmt(floor['commit']['median_ms'])} ms",
        f"  floor estimate (2 x raw chain step + 3 x commit) "
        f"{fmt(floor['estimate_ms'])} ms  → harvest is {fmt(ratio(hs, floor['estimate_ms']))}x the floor",
    ]
    th = res["throughput"]
    lines += ["", f"throughput ({cfg['concurrency']} in flight)"]
    for name in ("harvest", "raw_celery"):
        t = th[name]
        if "error" in t:
            lines.append(f"  {name:<12} error: {t['error']}")
        else:
            lines.append(f"  {name:<12} {fmt(t['workflows_per_s'])} workflows/s, "
                         f"{fmt(t['steps_per_s'], 1)} steps/s ({t['workflows']} workflows in "
                         f"{fmt(t['wall_s'])} s)")
    if "error" not in th["harvest"] and "error" not in th["raw_celery"]:
        lines.append(f"  raw Celery / harvest steps/s ............ "
                     f"{fmt(ratio(th['raw_celery']['steps_per_s'], th['harvest']['steps_per_s']))}x")
    dec = res["decide"]
    lines += ["", f"decision cost vs history length, in process — cold decide(): {dec['shape']}; "
              "warm (sticky session, what a decision worker does for a run it decided last):"]
    for rw in dec["rows"]:
        lines.append(f"  {rw['events']:>5} events: cold {fmt(rw['us_per_decision'], 1):>9} µs  "
                     f"({fmt(rw['us_per_event'], 2):>6} µs/event, x{fmt(rw['ratio_vs_smallest'], 1)})"
                     f"   warm {fmt(rw['us_per_warm_decision'], 1):>7} µs")
    c = res["codec"]
    lines += [
        "",
        f"payload codec, encode+decode of one ActivityScheduled event ({c['event_bytes']} B JSON, "
        f"{c['encoded_event_bytes']} B encrypted)",
        f"  no codec (Payloads())  {fmt(c['plain_us'], 1):>8} µs",
        f"  FernetCodec            {fmt(c['fernet_us'], 1):>8} µs  (encode {fmt(c['fernet_encode_us'], 1)}"
        f" + decode {fmt(c['fernet_decode_us'], 1)})  = {fmt(ratio(c['fernet_us'], c['plain_us']), 0)}x no codec",
        f"  context: json dumps+loads of the event {fmt(c['json_roundtrip_us'], 1)} µs; "
        f"Fernet per event is {fmt(ratio(c['fernet_us'] / 1000, hs) * 100, 3)}% of a harvest step",
        "",
    ]
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """NaN (a ratio with a missing side) becomes null, so the JSON is strict."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def machine_info() -> dict[str, Any]:
    import celery
    import redis
    import sqlalchemy as sa

    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform(), "celery": celery.__version__}
    try:
        engine = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{HARVEST_DB}")
        with engine.connect() as conn:
            info["postgres"] = conn.execute(sa.text("SHOW server_version")).scalar()
            info["synchronous_commit"] = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
        engine.dispose()
        info["redis"] = redis.Redis.from_url(REDIS_URL).info("server")["redis_version"]
    except Exception as exc:  # noqa: BLE001 - informational
        info["error"] = str(exc)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="sequential activities per workflow")
    parser.add_argument("--runs", type=int, default=10, help="measured workflows per system")
    parser.add_argument("--concurrency", type=int, default=1, help="workflows in flight (throughput)")
    parser.add_argument("--worker-concurrency", type=int, default=4, help="celery -c (threads)")
    parser.add_argument("--skip-dbos", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.runs < 1 or args.concurrency < 1:
        parser.error("--steps, --runs and --concurrency must be >= 1")

    import redis

    RESULTS.mkdir(parents=True, exist_ok=True)
    print("setting up: fresh database harvest_bench, Redis DB 7 flushed, migrating…", flush=True)
    redis.Redis.from_url(REDIS_URL).flushdb()
    fresh_database(HARVEST_DB)
    from benchmarks.app import harvest

    harvest.migrate()

    res: dict[str, Any] = {"config": {"steps": args.steps, "runs": args.runs,
                                      "concurrency": args.concurrency,
                                      "worker_concurrency": args.worker_concurrency,
                                      "worker_queues": WORKER_QUEUES, "result_poll_s": RESULT_POLL},
                           "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "machine": machine_info()}

    print("d. decision cost vs history length…", flush=True)
    res["decide"] = bench_decide()
    print("e. payload codec cost…", flush=True)
    res["codec"] = bench_codec()
    print("   Postgres commit latency…", flush=True)
    commit = bench_commit()
    if args.skip_dbos:
        res["dbos"] = {"error": "skipped (--skip-dbos)"}
    else:
        print("c. DBOS…", flush=True)
        res["dbos"] = bench_dbos(args.steps, args.runs)
        if "error" in res["dbos"]:
            print(f"   DBOS not run: {res['dbos']['error']}", flush=True)

    worker = Worker(WORKER_QUEUES, args.worker_concurrency, RESULTS / "worker.log")
    print(f"starting worker (-Q {WORKER_QUEUES} -P threads -c {args.worker_concurrency})…", flush=True)
    worker.start()
    try:
        print("a. harvest-celery latency…", flush=True)
        res["harvest"] = bench_harvest(args.steps, args.runs)
        print("b. raw Celery latency…", flush=True)
        res["raw_celery"] = bench_raw(args.steps, args.runs)
        total = max(args.runs, 2 * args.concurrency)
        print(f"   throughput: {total} workflows, {args.concurrency} in flight…", flush=True)
        res["throughput"] = {
            "harvest": throughput(lambda: harvest_run(args.steps), args.concurrency, total, args.steps),
            "raw_celery": throughput(lambda: raw_client_chain(args.steps), args.concurrency, total,
                                     args.steps),
        }
    finally:
        worker.stop()

    raw_chain_step = res["raw_celery"]["celery_chain"]["per_step"]["median_ms"]
    res["floor"] = {"commit": commit, "raw_chain_step_ms": raw_chain_step,
                    "estimate_ms": 2 * raw_chain_step + 3 * commit["median_ms"]}
    hs = res["harvest"]["per_step"]["median_ms"]
    res["ratios"] = {
        "harvest_over_raw_celery_client_waited": ratio(
            hs, res["raw_celery"]["client_waited"]["per_step"]["median_ms"]),
        "harvest_over_raw_celery_chain": ratio(hs, raw_chain_step),
        "harvest_over_dbos": ratio(hs, res["dbos"].get("per_step", {}).get("median_ms")),
        "harvest_over_floor": ratio(hs, res["floor"]["estimate_ms"]),
    }
    print(render(res))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(_finite(res), indent=2, default=str) + "\n")
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
